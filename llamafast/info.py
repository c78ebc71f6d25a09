"""What `llamafast info` reports, computed from tensor headers without loading the weights."""

from __future__ import annotations

from pathlib import Path

import torch

from llamafast.checkpoint import expected_shapes, open_checkpoint
from llamafast.config import ModelConfig, model_config
from llamafast.load import bundled_model
from llamafast.tokenizer import Tokenizer
from llamafast.weights import checkpoint_dtype, validate


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _summary(config: ModelConfig, shapes: dict[str, tuple[int, ...]], dtype: torch.dtype) -> dict:
    tied = "output.weight" not in shapes
    params = sum(_numel(s) for s in shapes.values())
    read = params - (0 if tied else config.vocab_size * config.dim) + config.dim  # embedding: one row
    kv_per_position = 2 * config.n_layers * config.kv_dim * dtype.itemsize
    return {
        "config": {**config.to_dict(), "head_dim": config.head_dim},
        "parameters": params,
        "tied_embeddings": tied,
        "dtype": str(dtype).removeprefix("torch."),
        "weight_bytes_per_token": read * dtype.itemsize,
        "kv_bytes_per_context_token": kv_per_position,
        "kv_bytes_at_full_context": kv_per_position * config.max_seq_len,
    }


def describe_checkpoint(path: Path | None, tokenizer: Path | None = None) -> dict:
    ckpt = open_checkpoint(path or bundled_model(), tokenizer)
    validate(ckpt)
    shapes = {name: ref.shape for name, ref in ckpt.tensors.items()}
    out = {"path": str(ckpt.path), "format": ckpt.format, **_summary(ckpt.config, shapes, checkpoint_dtype(ckpt))}
    if ckpt.tokenizer is not None:
        tok = Tokenizer(ckpt.tokenizer)
        out["tokenizer"] = {"path": str(ckpt.tokenizer), "vocab": tok.vocab_size, "bos": tok.bos_id, "eos": tok.eos_id}
    return out


def describe_shape(name: str) -> dict:
    config = model_config(name)
    return {"shape": name, **_summary(config, expected_shapes(config), torch.bfloat16)}
