"""Writers of small synthetic checkpoints in the formats users have, for the loader tests.

Written from the formats' descriptions (Meta's fairscale sharding, HF's rotate-half permutation,
llama2.c export.py), independently of llamafast/formats/, so the loaders are checked against them.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from llamafast.config import ModelConfig


def meta_state(config: ModelConfig, tied: bool = False, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights under Meta's names (wq, wk, wv separate)."""
    g = torch.Generator().manual_seed(seed)
    C, F, KV, V = config.dim, config.hidden_dim, config.kv_dim, config.vocab_size
    rnd = lambda *s: torch.randn(*s, generator=g) * s[-1] ** -0.5  # noqa: E731
    state = {"tok_embeddings.weight": rnd(V, C), "norm.weight": 1 + 0.1 * torch.randn(C, generator=g)}
    state["output.weight"] = state["tok_embeddings.weight"] if tied else rnd(V, C)
    for i in range(config.n_layers):
        p = f"layers.{i}."
        state.update({p + "attention.wq.weight": rnd(C, C), p + "attention.wk.weight": rnd(KV, C)})
        state.update({p + "attention.wv.weight": rnd(KV, C), p + "attention.wo.weight": rnd(C, C)})
        state.update({p + "feed_forward.w1.weight": rnd(F, C), p + "feed_forward.w2.weight": rnd(C, F)})
        state.update({p + "feed_forward.w3.weight": rnd(F, C)})
        state[p + "attention_norm.weight"] = 1 + 0.1 * torch.randn(C, generator=g)
        state[p + "ffn_norm.weight"] = 1 + 0.1 * torch.randn(C, generator=g)
    return state


def fused(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Meta names -> llamafast's (wq|wk|wv concatenated into wqkv)."""
    out = {}
    for name, t in state.items():
        if ".wq." in name:
            k, v = state[name.replace(".wq.", ".wk.")], state[name.replace(".wq.", ".wv.")]
            out[name.replace(".wq.", ".wqkv.")] = torch.cat([t, k, v])
        elif ".wk." not in name and ".wv." not in name:
            out[name] = t
    return out


# Meta's model-parallel layers: column-parallel (split rows) and row-parallel / embedding (split columns).
_COLUMN = ("wq", "wk", "wv", "w1", "w3", "output")
_ROW = ("wo", "w2", "tok_embeddings")


def write_meta(folder: Path, config: ModelConfig, state: dict, n_shards: int = 1, tokenizer: Path | None = None):
    folder.mkdir(parents=True, exist_ok=True)
    params = {"dim": config.dim, "n_layers": config.n_layers, "n_heads": config.n_heads,
              "n_kv_heads": config.n_kv_heads, "vocab_size": -1, "multiple_of": config.multiple_of,
              "norm_eps": config.norm_eps}
    if config.ffn_dim_multiplier is not None:
        params["ffn_dim_multiplier"] = config.ffn_dim_multiplier
    (folder / "params.json").write_text(json.dumps(params))
    shards = [{} for _ in range(n_shards)]
    for name, t in state.items():
        kind = name.split(".")[-2]
        dim = 0 if kind in _COLUMN else 1 if kind in _ROW else None
        parts = [t] * n_shards if dim is None else list(torch.chunk(t, n_shards, dim))
        for shard, part in zip(shards, parts):
            shard[name] = part.clone()
    for i, shard in enumerate(shards):
        shard["rope.freqs"] = torch.ones(config.head_dim // 2)
        torch.save(shard, folder / f"consolidated.{i:02d}.pth")
    _copy_tokenizer(folder, tokenizer)


def hf_permute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """What HF's convert_llama_weights_to_hf.py does to wq/wk: even rows of each head first, then odd."""
    rows, cols = w.shape
    return w.reshape(n_heads, rows // n_heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


_HF = {"attention.wq": "self_attn.q_proj", "attention.wk": "self_attn.k_proj", "attention.wv": "self_attn.v_proj",
       "attention.wo": "self_attn.o_proj", "feed_forward.w1": "mlp.gate_proj", "feed_forward.w2": "mlp.down_proj",
       "feed_forward.w3": "mlp.up_proj", "attention_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}


def write_hf(folder: Path, config: ModelConfig, state: dict, n_shards: int = 1, tied: bool = False,
             tokenizer: Path | None = None, dtype: torch.dtype = torch.float32):
    folder.mkdir(parents=True, exist_ok=True)
    hf = {}
    for name, t in state.items():
        if name == "output.weight" and tied:
            continue
        parts = name.split(".")
        if parts[0] == "layers":
            key, kind = ".".join(parts[2:-1]), parts[-2]
            t = hf_permute(t, config.n_heads if kind == "wq" else config.n_kv_heads) if kind in ("wq", "wk") else t
            hf_name = f"model.layers.{parts[1]}.{_HF[key]}.weight"
        else:
            hf_name = {"tok_embeddings.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
                       "output.weight": "lm_head.weight"}[name]
        hf[hf_name] = t.to(dtype).contiguous()
    cfg = {"model_type": "llama", "hidden_size": config.dim, "intermediate_size": config.hidden_dim,
           "num_hidden_layers": config.n_layers, "num_attention_heads": config.n_heads,
           "num_key_value_heads": config.n_kv_heads, "vocab_size": config.vocab_size,
           "max_position_embeddings": config.max_seq_len, "rms_norm_eps": config.norm_eps,
           "rope_theta": config.rope_theta, "tie_word_embeddings": tied}
    (folder / "config.json").write_text(json.dumps(cfg))
    names = sorted(hf)
    if n_shards == 1:
        save_file(hf, folder / "model.safetensors", metadata={"format": "pt"})
    else:
        weight_map = {}
        for i in range(n_shards):
            file = f"model-{i + 1:05d}-of-{n_shards:05d}.safetensors"
            chunk = {n: hf[n] for n in names[i::n_shards]}
            save_file(chunk, folder / file, metadata={"format": "pt"})
            weight_map.update({n: file for n in chunk})
        (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    _copy_tokenizer(folder, tokenizer)


def write_llama2c_v1(path: Path, config: ModelConfig, state: dict, shared: bool):
    """llama2.c export.py version1_export: 256-byte header, then fp32 weights grouped by kind."""
    L = config.n_layers
    header = struct.pack("<Ii", 0x616B3432, 1) + struct.pack(
        "<7i", config.dim, config.hidden_dim, L, config.n_heads, config.n_kv_heads, config.vocab_size,
        config.max_seq_len) + struct.pack("B", int(shared))
    order = [f"layers.{i}.attention_norm.weight" for i in range(L)] + [f"layers.{i}.ffn_norm.weight" for i in range(L)]
    order += ["norm.weight", "tok_embeddings.weight"]
    for key in ("attention.wq", "attention.wk", "attention.wv", "attention.wo",
                "feed_forward.w1", "feed_forward.w2", "feed_forward.w3"):
        order += [f"layers.{i}.{key}.weight" for i in range(L)]
    if not shared:
        order.append("output.weight")
    with open(path, "wb") as f:
        f.write(header + b"\0" * (256 - len(header)))
        for name in order:
            f.write(state[name].float().numpy().astype(np.float32).tobytes())


def _copy_tokenizer(folder: Path, tokenizer: Path | None):
    if tokenizer is not None:
        (folder / "tokenizer.model").write_bytes(Path(tokenizer).read_bytes())
