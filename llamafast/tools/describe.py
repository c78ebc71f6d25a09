"""What `llamafast info` reports, computed from tensor headers without loading the weights."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from llamafast.formats import expected_shapes, open_checkpoint
from llamafast.formats.gguf import with_block_head
from llamafast.config import ModelConfig, model_config
from llamafast.load import bundled_model
from llamafast.tokenizers import open_tokenizer
from llamafast.load.weights import checkpoint_dtype, checkpoint_formats, sparse_layout, stored_formats, validate
from llamafast.quant import is_quantized_linear


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


@dataclass(frozen=True)
class Stored:
    """One checkpoint tensor: the weights it holds (0 for scales), its bytes as stored, and its format's name."""

    params: int
    nbytes: int
    format: str


def _stored(ckpt) -> dict[str, Stored]:
    """Per tensor, as the checkpoint stores it: a GGUF file's kept blocks and a block checkpoint's data and scales
    count their bytes (block data and fp16 scales), FP8 bit patterns one byte each, float tensors their dtype's."""
    (layers, head), own = checkpoint_formats(ckpt), stored_formats(ckpt)
    out = {}
    for name, ref in ckpt.tensors.items():
        fmt = ref.fmt if ref.fmt.is_block else head if name.startswith("output.") else own.get(
            name.removesuffix(".scale") + ".weight" if name.endswith(".scale") else name, layers)
        if ref.fmt.is_block:  # GGUF blocks: the shape counts weights, the file holds blocks
            n, k = ref.shape
            out[name] = Stored(n * k, fmt.file_bytes(n, k), fmt.value)
        elif name.endswith(".scale"):
            out[name] = Stored(0, _numel(ref.shape) * ref.dtype.itemsize, fmt.value)
        elif is_quantized_linear(name) and not ref.dtype.is_floating_point:
            n, cols = ref.shape
            out[name] = Stored(n * cols * 8 // fmt.bits, n * cols, fmt.value)  # Q4: 2 a byte
        else:
            out[name] = Stored(_numel(ref.shape), _numel(ref.shape) * ref.dtype.itemsize,
                               str(ref.dtype).removeprefix("torch."))
    return out


_GROUPS = (("attention", ".attention."), ("ffn", ".feed_forward."), ("lm_head", "output.weight"),
           ("embedding", "tok_embeddings."), ("norms", "norm."))


def formats_by_group(tensors: dict[str, Stored]) -> dict[str, str]:
    """Each tensor group's format ("q4_0"; "q4_1+q8_0" where it mixes, most weights first); a tied LM head is the
    embedding table's."""
    out = {}
    for group, mark in _GROUPS:
        counts = Counter()
        for name, t in tensors.items():
            if mark in name and t.params:
                counts[t.format] += t.params
        out[group] = "+".join(f for f, _ in counts.most_common()) or None
    out["lm_head"] = out["lm_head"] or out["embedding"]
    return out


def _summary(config: ModelConfig, tensors: dict[str, Stored], act_dtype: torch.dtype, tied: bool = False) -> dict:
    """tied: the head holds the table's values, in a tensor of its own or (where tensors has none) the table's."""
    tied = tied or "output.weight" not in tensors
    formats = formats_by_group(tensors)
    stored = sum(t.nbytes for t in tensors.values())
    embedding = tensors["tok_embeddings.weight"].nbytes
    own_head = "output.weight" in tensors  # else the head reads the whole table
    read = stored - (embedding - config.dim * act_dtype.itemsize if own_head else 0)  # the table: one row a token
    kv_per_position = 2 * config.n_layers * config.kv_dim * act_dtype.itemsize
    layers = "+".join(dict.fromkeys(f for g in ("attention", "ffn") for f in formats[g].split("+")))
    return {
        "config": {**config.to_dict(), "head_dim": config.head_dim},
        "parameters": sum(t.params for name, t in tensors.items() if not (tied and name == "output.weight")),
        "tied_embeddings": tied,
        "dtype": str(act_dtype).removeprefix("torch."),
        "weights": layers,
        "formats": formats,
        "weight_bytes_per_token": read,
        "kv_bytes_per_context_token": kv_per_position,
        "kv_bytes_at_full_context": kv_per_position * config.max_seq_len,
    }


def describe_checkpoint(path: Path | None, tokenizer: Path | None = None) -> dict:
    ckpt = open_checkpoint(path or bundled_model(), tokenizer)
    validate(ckpt)
    tied = "output.weight" not in ckpt.tensors
    stored = _stored(with_block_head(ckpt))  # as the model holds them: a tied GGUF's head in its table's blocks
    out = {"path": str(ckpt.path), "format": ckpt.format, **_summary(ckpt.config, stored, checkpoint_dtype(ckpt), tied)}
    if ckpt.metadata:
        out["metadata"] = {k: v for k, v in ckpt.metadata.items() if k not in ("config", "sparse")}
    layout = sparse_layout(ckpt)
    if layout is not None:
        out["sparse"] = _sparse_summary(layout, json.loads(ckpt.metadata["sparse"]), ckpt.config.hidden_dim)
    if ckpt.tokenizer is not None:
        tok = open_tokenizer(ckpt.tokenizer, ckpt.embedded_tokenizer)
        out["tokenizer"] = {"path": str(ckpt.tokenizer), "vocab": tok.vocab_size, "bos": tok.bos_id, "eos": tok.eos_id}
        out.update(vocab_mismatch(tok.vocab_size, ckpt.config.vocab_size))
    return out


def _sparse_summary(layout, record: dict, hidden: int) -> dict:
    calibration = record.get("calibration", {})
    return {"modes": "router, gate", "group_size": layout.group_size, "groups_per_layer": layout.n_groups(hidden),
            "default_sparsity": layout.default, "levels": f"{layout.levels[0]:g}..{layout.levels[-1]:g}",
            "calibration": f"{calibration.get('tokens')} tokens of {calibration.get('file')} "
                           f"(sha256 {str(calibration.get('sha256'))[:12]})"}


def vocab_mismatch(pieces: int, vocab: int) -> dict:
    """What generate does with this tokenizer and model: refuse a tokenizer with more pieces than the model
    has ids; never sample the padding ids past a smaller tokenizer's pieces."""
    if pieces > vocab:
        return {"problem": f"the tokenizer has {pieces} pieces but the model only {vocab} ids: generate refuses them"}
    if pieces < vocab:
        return {"note": f"the model's last {vocab - pieces} ids have no tokenizer piece and are never sampled"}
    return {}


def describe_shape(name: str) -> dict:
    config = model_config(name)
    tensors = {n: Stored(_numel(s), _numel(s) * 2, "bfloat16") for n, s in expected_shapes(config).items()}
    return {"shape": name, **_summary(config, tensors, torch.bfloat16)}
