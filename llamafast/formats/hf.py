"""Hugging Face's format: config.json + *.safetensors (sharded with an index), names mapped onto Meta's and the
Q/K rows un-permuted; config fields that change the arithmetic and that llamafast lacks are refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from llamafast.config import ModelConfig
from llamafast.errors import LlamafastError
from llamafast.formats.common import (
    ST_DTYPES, Checkpoint, TensorRef, config_from, open_safetensors, read_json, safetensors_narrow, safetensors_views,
)

_HF_NAMES = {
    "model.embed_tokens.weight": "tok_embeddings.weight",
    "model.norm.weight": "norm.weight",
    "lm_head.weight": "output.weight",
}
_HF_LAYER_NAMES = {
    "self_attn.q_proj": "attention.wq",
    "self_attn.k_proj": "attention.wk",
    "self_attn.v_proj": "attention.wv",
    "self_attn.o_proj": "attention.wo",
    "mlp.gate_proj": "feed_forward.w1",
    "mlp.down_proj": "feed_forward.w2",
    "mlp.up_proj": "feed_forward.w3",
    "input_layernorm": "attention_norm",
    "post_attention_layernorm": "ffn_norm",
}


def read_hf(path: Path) -> Checkpoint:
    cfg = read_json(path / "config.json")
    origin = path / "config.json"
    if cfg.get("model_type", "llama") != "llama":
        raise LlamafastError(f"{origin} describes a {cfg['model_type']!r} model, not Llama")
    _refuse_unimplemented(cfg, origin)
    config = config_from(
        {
            "dim": cfg.get("hidden_size"),
            "n_layers": cfg.get("num_hidden_layers"),
            "n_heads": cfg.get("num_attention_heads"),
            "n_kv_heads": cfg.get("num_key_value_heads"),
            "vocab_size": cfg.get("vocab_size"),
            "hidden_dim": cfg.get("intermediate_size"),
            "norm_eps": cfg.get("rms_norm_eps", 1e-5),
            "rope_theta": _rope(cfg)[1].get("rope_theta", cfg.get("rope_theta", 10000.0)),
            "rope_scaling": _rope_scaling(cfg, origin),
            "max_seq_len": cfg.get("max_position_embeddings", 4096),
        },
        origin,
        _HF_CONFIG_KEYS,
    )
    tensors = {}
    for file in _hf_files(path):
        handle = open_safetensors(file)
        views = safetensors_views(file)
        for key in handle.keys():
            name = _hf_to_meta(key)
            if name is not None:
                tensors[name] = _hf_ref(handle, key, name, file, config, views.get(key))
    if cfg.get("tie_word_embeddings") is True:
        tensors.pop("output.weight", None)  # transformers ties the head to the embedding after loading
    elif cfg.get("tie_word_embeddings") is False and "output.weight" not in tensors:
        raise LlamafastError(f"{path}: lm_head.weight missing, and {origin.name} says tie_word_embeddings false")
    return Checkpoint(path, "hf", config, tensors, None)


_HF_CONFIG_KEYS = {
    "dim": "hidden_size", "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads", "vocab_size": "vocab_size", "hidden_dim": "intermediate_size",
    "norm_eps": "rms_norm_eps", "rope_theta": "rope_theta", "max_seq_len": "max_position_embeddings",
}


def _rope(cfg: dict) -> tuple[str, dict]:
    """(key, table) of the RoPE settings in either layout: transformers 5's `rope_parameters`, or the older
    `rope_scaling` (beside a top-level `rope_theta`); an empty table is plain RoPE."""
    for key in ("rope_parameters", "rope_scaling"):
        table = cfg.get(key)
        if table is not None:
            if not isinstance(table, dict):
                raise LlamafastError(f"config.json: {key} must be a table, got {json.dumps(table)}")
            return key, table
    return "rope_parameters", {}


def _rope_scaling(cfg: dict, origin: Path) -> tuple[float, float, float, int] | None:
    """None for plain RoPE; Llama 3.1's (factor, low_freq_factor, high_freq_factor, original context)."""
    key, table = _rope(cfg)
    kind = table.get("rope_type", table.get("type", "default"))
    if kind == "default":
        return None
    if kind != "llama3":
        raise LlamafastError(f"{origin}: {key}.rope_type = {json.dumps(kind)} is not supported by llamafast")
    try:
        return (float(table["factor"]), float(table["low_freq_factor"]), float(table["high_freq_factor"]),
                int(table["original_max_position_embeddings"]))
    except (KeyError, TypeError, ValueError) as e:
        raise LlamafastError(f"{origin}: {key} of rope_type llama3 lacks a valid {e}") from None


def _refuse_unimplemented(cfg: dict, origin: Path) -> None:
    """Every config.json field that changes the arithmetic and that llamafast does not implement is refused
    by name; fields that do not change it (dropout, initializer_range, pretraining_tp, ...) are ignored."""
    head_dim = cfg.get("head_dim")
    heads, width = cfg.get("num_attention_heads"), cfg.get("hidden_size")
    key, table = _rope(cfg)
    problems = {
        f"{key}.partial_rotary_factor": (table.get("partial_rotary_factor", 1.0), (1, 1.0)),
        "attention_bias": (cfg.get("attention_bias", False), (False,)),
        "mlp_bias": (cfg.get("mlp_bias", False), (False,)),
        "sliding_window": (cfg.get("sliding_window"), (None,)),
        "hidden_act": (cfg.get("hidden_act", "silu"), ("silu",)),
    }
    for name, (value, allowed) in problems.items():
        if value not in allowed:
            raise LlamafastError(f"{origin}: {name} = {json.dumps(value)} is not supported by llamafast")
    if head_dim is not None and isinstance(heads, int) and heads > 0 and head_dim * heads != width:
        raise LlamafastError(f"{origin}: head_dim = {head_dim} is not hidden_size / num_attention_heads "
                             f"({width} / {heads}), which llamafast does not support")


def _hf_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if not index.is_file():
        return sorted(path.glob("*.safetensors"))
    weight_map = read_json(index).get("weight_map", {})
    files = sorted({path / f for f in weight_map.values()})
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise LlamafastError(f"{index.name} names shards that are missing: {', '.join(missing)}")
    return files


def _hf_to_meta(key: str) -> str | None:
    if key in _HF_NAMES:
        return _HF_NAMES[key]
    parts = key.split(".")
    if key.endswith("rotary_emb.inv_freq"):
        return None  # older exports carry the RoPE frequencies; they are recomputed
    if parts[:2] == ["model", "layers"] and len(parts) >= 5:
        inner = ".".join(parts[3:-1])
        if inner in _HF_LAYER_NAMES:
            return f"layers.{parts[2]}.{_HF_LAYER_NAMES[inner]}.{parts[-1]}"
    return key  # unknown: kept, so that validation names it


def _hf_ref(handle, key: str, name: str, file: Path, config: ModelConfig, view=None) -> TensorRef:
    info = handle.get_slice(key)
    shape, dtype = tuple(info.get_shape()), ST_DTYPES.get(info.get_dtype(), torch.float32)
    heads = {"wq": config.n_heads, "wk": config.n_kv_heads}.get(name.split(".")[-2])

    def load() -> torch.Tensor:
        t = view() if view is not None else handle.get_tensor(key)  # view: zero-copy, common.safetensors_views
        return _unpermute_rope(t, heads) if heads else t

    read = safetensors_narrow(handle, key)

    def narrow(dim: int, start: int, length: int) -> torch.Tensor:
        t = read(dim, start, length)
        if not heads:
            return t
        if dim == 1:
            return _unpermute_rope(t, heads)
        # the permutation stays within each head, so whole heads un-permute on their own
        d = shape[0] // heads
        assert start % d == 0 and length % d == 0, f"{name}: rows {start}+{length} cut a head of {d}"
        return _unpermute_rope(t, length // d)

    return TensorRef(shape, dtype, load, file.name, narrow)


def _unpermute_rope(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """HF stores each head's q/k rows as [even pair members..., odd...] for rotate-half RoPE; Meta interleaves."""
    rows, cols = w.shape
    d = rows // n_heads
    return w.reshape(n_heads, 2, d // 2, cols).transpose(1, 2).reshape(rows, cols)
