"""Small GGUF files written with the gguf package's own writer, for the loader tests: the weights of a
ModelConfig in any supported tensor type, under llama.cpp's tensor names, with a byte-level BPE tokenizer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from llamafast.config import ModelConfig

_NAMES = {"attention.wq": "attn_q", "attention.wk": "attn_k", "attention.wv": "attn_v", "attention.wo": "attn_output",
          "feed_forward.w1": "ffn_gate", "feed_forward.w2": "ffn_down", "feed_forward.w3": "ffn_up",
          "attention_norm": "attn_norm", "ffn_norm": "ffn_norm"}
# Blocks gguf.quants cannot quantize to: values per block, bytes per block and the byte offsets of their fp16 scale
# fields (the tests write random blocks with small, finite scales and compare with its dequantizer).
_RANDOM_BLOCKS = {"Q4_K": (256, 144, (0, 2)), "Q5_K": (256, 176, (0, 2)), "Q6_K": (256, 210, (208,)),
                  "Q2_K": (256, 84, (80, 82)), "Q3_K": (256, 110, (108,)), "IQ4_NL": (32, 18, (0,))}
_INTEGERS = {"I8": np.int8, "I16": np.int16, "I32": np.int32}  # raw integer tensors, which nothing dequantizes


def gguf_name(name: str) -> str:
    parts = name.split(".")
    if parts[0] == "layers":
        return f"blk.{parts[1]}.{_NAMES['.'.join(parts[2:-1])]}.weight"
    return {"tok_embeddings.weight": "token_embd.weight", "norm.weight": "output_norm.weight",
            "output.weight": "output.weight"}[name]


def encode(w: np.ndarray, kind: str, rng: np.random.Generator) -> np.ndarray:
    """w (rows, cols) float32 -> what GGUF stores for type `kind` (uint8 blocks for quantized types)."""
    from gguf import GGMLQuantizationType, quants

    if kind in _INTEGERS:
        return w.astype(_INTEGERS[kind])
    if kind in _RANDOM_BLOCKS:
        values, size, scales = _RANDOM_BLOCKS[kind]
        blocks = rng.integers(0, 256, (w.shape[0], w.shape[1] // values, size), dtype=np.uint8)
        for at in scales:
            blocks[..., at:at + 2] = np.array([0.002], dtype=np.float16).view(np.uint8)
        return blocks.reshape(w.shape[0], -1)
    return quants.quantize(w, GGMLQuantizationType[kind])


def write_gguf(path: Path, config: ModelConfig, state: dict[str, torch.Tensor], kind: str = "F32",
               arch: str = "llama", chat_template: str | int | None = None, rope_freqs: np.ndarray | None = None,
               special: dict[str, int | None] | None = None, kinds: dict[str, str] | None = None) -> None:
    """Linear weights and the embedding in `kind` (kinds: other types for some of them, by model tensor name),
    norms in F32; Meta's Q/K row order, as llama.cpp stores it. A chat_template given as a number is stored as one
    (a broken file); special overrides the bos and eos ids ({"eos": None} leaves tokenizer.ggml.eos_token_id
    out)."""
    from gguf import GGMLQuantizationType, GGUFWriter

    rng = np.random.default_rng(0)
    w = GGUFWriter(path, arch)
    w.add_block_count(config.n_layers)
    w.add_context_length(config.max_seq_len)
    w.add_embedding_length(config.dim)
    w.add_feed_forward_length(config.hidden_dim)
    w.add_head_count(config.n_heads)
    w.add_head_count_kv(config.n_kv_heads)
    w.add_rope_freq_base(config.rope_theta)
    w.add_layer_norm_rms_eps(config.norm_eps)
    w.add_rope_dimension_count(config.head_dim)
    _tokenizer(w, config.vocab_size, chat_template, {"bos": 0, "eos": 0, **(special or {})})
    if rope_freqs is not None:  # Llama 3.1's scaled RoPE, as llama.cpp's converter writes it
        w.add_tensor("rope_freqs.weight", rope_freqs.astype(np.float32))
    for name, t in state.items():
        data, its = t.float().numpy(), (kinds or {}).get(name, kind)
        if data.ndim == 1 or its == "F32":
            w.add_tensor(gguf_name(name), data)
        else:
            w.add_tensor(gguf_name(name), encode(data, its, rng), raw_dtype=GGMLQuantizationType[its])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _tokenizer(w, vocab: int, chat_template: str | int | None, special: dict[str, int | None]) -> None:
    """A byte-level vocabulary: the 256 byte symbols, then merged pairs, padded to the model's vocabulary."""
    from gguf import GGUFWriter  # noqa: F401  (the writer's methods are used on w)
    from tokenizers.pre_tokenizers import ByteLevel

    symbols = sorted(ByteLevel.alphabet())
    tokens = ["<|endoftext|>"] + symbols + [f"<pad{i}>" for i in range(vocab - 1 - len(symbols))]
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3] + [1] * (len(tokens) - 1))
    w.add_token_merges([])
    if special["bos"] is not None:
        w.add_bos_token_id(special["bos"])
    if special["eos"] is not None:
        w.add_eos_token_id(special["eos"])
    if isinstance(chat_template, int):
        w.add_uint32("tokenizer.chat_template", chat_template)
    elif chat_template is not None:
        w.add_chat_template(chat_template)
