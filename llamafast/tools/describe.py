"""What `llamafast info` reports, computed from tensor headers without loading the weights."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from llamafast.formats import expected_shapes, open_checkpoint
from llamafast.config import ModelConfig, model_config
from llamafast.load import bundled_model
from llamafast.tokenizers import open_tokenizer
from llamafast.load.weights import checkpoint_dtype, checkpoint_formats, sparse_layout, validate, weights_label


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _summary(config: ModelConfig, tensors: dict[str, tuple[tuple[int, ...], torch.dtype]], weights: str) -> dict:
    """tensors: name -> (shape, dtype), as stored (FP8 weights are int8, 1 byte each)."""
    tied = "output.weight" not in tensors
    emb_shape, act_dtype = tensors["tok_embeddings.weight"]
    params = sum(_numel(shape) for name, (shape, _) in tensors.items() if not name.endswith(".scale"))
    stored = sum(_numel(shape) * dtype.itemsize for shape, dtype in tensors.values())
    embedding = _numel(emb_shape) * act_dtype.itemsize
    read = stored - (0 if tied else embedding - config.dim * act_dtype.itemsize)  # the table: one row per token
    kv_per_position = 2 * config.n_layers * config.kv_dim * act_dtype.itemsize
    return {
        "config": {**config.to_dict(), "head_dim": config.head_dim},
        "parameters": params,
        "tied_embeddings": tied,
        "dtype": str(act_dtype).removeprefix("torch."),
        "weights": weights,
        "weight_bytes_per_token": read,
        "kv_bytes_per_context_token": kv_per_position,
        "kv_bytes_at_full_context": kv_per_position * config.max_seq_len,
    }


def describe_checkpoint(path: Path | None, tokenizer: Path | None = None) -> dict:
    ckpt = open_checkpoint(path or bundled_model(), tokenizer)
    validate(ckpt)
    tensors = {name: (ref.shape, ref.dtype) for name, ref in ckpt.tensors.items()}
    weights = weights_label(checkpoint_formats(ckpt)[0], checkpoint_dtype(ckpt))
    out = {"path": str(ckpt.path), "format": ckpt.format, **_summary(ckpt.config, tensors, weights)}
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
    tensors = {n: (shape, torch.bfloat16) for n, shape in expected_shapes(config).items()}
    return {"shape": name, **_summary(config, tensors, "bfloat16")}
