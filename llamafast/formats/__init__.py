"""Checkpoint formats: detection from the files, config, and lazy tensor references.

Every reader maps its tensors onto Meta's names (layers.{i}.attention.wq.weight, ...) and returns
TensorRefs that know their shape without reading data; weights.py validates and loads them.
Formats: Meta (params.json + consolidated.NN.pth), Hugging Face (config.json + *.safetensors),
llama2.c (.bin, versions 0 and 1) and llamafast's own (safetensors with its format in the metadata).
"""

from __future__ import annotations

import json
import pickle
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError, safe_open

from llamafast.config import ModelConfig
from llamafast.errors import LlamafastError

LLAMAFAST_FORMAT_KEY = "llamafast_format"  # safetensors metadata key; its value is the format version
LLAMA2C_MAGIC = 0x616B3432  # "ak42", the header of llama2.c's versioned exports


@dataclass
class TensorRef:
    shape: tuple[int, ...]
    dtype: torch.dtype
    load: Callable[[], torch.Tensor]  # returns a CPU tensor, memory-mapped where the format allows
    origin: str  # file name, for error messages


@dataclass
class Checkpoint:
    path: Path
    format: str  # "meta" | "hf" | "llama2c" | "llamafast"
    config: ModelConfig
    tensors: dict[str, TensorRef]  # Meta names (llamafast: its stored names)
    tokenizer: Path | None
    metadata: dict[str, str] = field(default_factory=dict)  # llamafast format: weights, source, ...


def open_checkpoint(path: Path, tokenizer: Path | None = None) -> Checkpoint:
    path = Path(path)
    if not path.exists():
        raise LlamafastError(f"model path not found: {path}")
    reader = _detect(path)
    ckpt = reader(path)
    ckpt.tokenizer = _find_tokenizer(ckpt, tokenizer)
    return ckpt


def _detect(path: Path) -> Callable[[Path], Checkpoint]:
    if path.is_dir():
        if (path / "params.json").is_file() and any(path.glob("consolidated.*.pth")):
            return _read_meta
        files = sorted(path.glob("*.safetensors"))
        if files and LLAMAFAST_FORMAT_KEY in safetensors_metadata(files[0]):
            return _read_llamafast
        if files and (path / "config.json").is_file():
            return _read_hf
        raise LlamafastError(
            f"cannot tell the checkpoint format of {path}: expected params.json + consolidated.*.pth (Meta), "
            "config.json + *.safetensors (Hugging Face) or a llamafast checkpoint"
        )
    head = _head(path, 32)
    if _looks_like_safetensors(head):
        if LLAMAFAST_FORMAT_KEY in safetensors_metadata(path):
            return _read_llamafast
        raise LlamafastError(f"{path} is a safetensors file without llamafast metadata: pass its directory")
    if head[:2] == b"PK":
        raise LlamafastError(f"{path} is a PyTorch file: pass the directory holding it with its params.json")
    if len(head) >= 8 and struct.unpack("<I", head[:4])[0] == LLAMA2C_MAGIC or _llama2c_v0_header(path):
        return _read_llama2c
    raise LlamafastError(
        f"unknown checkpoint format: {path} (expected a directory, or a llama2.c .bin or llamafast .safetensors file)"
    )


def _head(path: Path, n: int) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except OSError as e:
        raise LlamafastError(f"cannot read {path}: {e.strerror}") from None


def _find_tokenizer(ckpt: Checkpoint, given: Path | None) -> Path | None:
    if given is not None:
        if not Path(given).is_file():
            raise LlamafastError(f"tokenizer not found: {given}")
        return Path(given)
    folder = ckpt.path if ckpt.path.is_dir() else ckpt.path.parent
    for name in ("tokenizer.model", f"tok{ckpt.config.vocab_size}.model"):
        if (folder / name).is_file():
            return folder / name
    return None


# --- Meta: params.json + consolidated.NN.pth ----------------------------------------------------

# Meta's fairscale layers: ColumnParallelLinear shards dim 0, RowParallelLinear and ParallelEmbedding dim 1.
_META_SHARD_DIM = {"wq": 0, "wk": 0, "wv": 0, "w1": 0, "w3": 0, "output": 0, "wo": 1, "w2": 1, "tok_embeddings": 1}
_META_IGNORED = {"rope.freqs"}  # Meta ships the RoPE frequencies; they are recomputed
# params.json fields of later Meta releases that change the arithmetic (Llama 3.1's scaled RoPE, Llama 4's
# experts and chunked attention): refused when set, never ignored.
_META_UNSUPPORTED = ("use_scaled_rope", "rope_scaling", "moe_args", "vision_args", "attention_chunk_size", "use_qk_norm")


def _read_meta(path: Path) -> Checkpoint:
    params = _read_json(path / "params.json")
    for key in _META_UNSUPPORTED:
        if params.get(key):
            raise LlamafastError(f"{path / 'params.json'}: {key} = {json.dumps(params[key])} is not supported by llamafast")
    shards = sorted(path.glob("consolidated.*.pth"))
    states = [_torch_load(s) for s in shards]
    tensors = {}
    for name in states[0]:
        if name in _META_IGNORED:
            continue
        parts = [_shard_tensor(st, name, s) for st, s in zip(states, shards)]
        tensors[name] = _merged_ref(name, parts, shards)
    emb = tensors.get("tok_embeddings.weight")
    vocab = params.get("vocab_size", -1)
    if isinstance(vocab, int) and vocab <= 0 and emb is not None:  # Meta writes -1: the tensors know
        params["vocab_size"] = emb.shape[0]
    return Checkpoint(path, "meta", _config(params, path / "params.json"), tensors, None)


def _torch_load(path: Path) -> dict:
    """Tensors only: weights_only refuses pickled objects of any other kind, so no code in the file runs."""
    try:
        try:
            state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        except RuntimeError as e:
            if "mmap can only be used" not in str(e):
                raise
            state = torch.load(path, map_location="cpu", weights_only=True)  # a legacy (not zip) file: read whole
    except pickle.UnpicklingError:
        raise LlamafastError(f"{path} holds Python objects other than tensors; llamafast reads only plain tensor "
                             "checkpoints and never runs code from a file") from None
    except Exception as e:  # torch raises RuntimeError, EOFError... for a truncated or corrupt file
        raise LlamafastError(f"cannot read {path}: {str(e).splitlines()[0]}") from None
    if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
        raise LlamafastError(f"{path} is not a state dict of tensors")
    return state


def _shard_tensor(state: dict, name: str, shard: Path) -> torch.Tensor:
    if name not in state:
        raise LlamafastError(f"{shard.name} lacks tensor {name} that the first shard has")
    return state[name]


def _merged_ref(name: str, parts: list[torch.Tensor], shards: list[Path]) -> TensorRef:
    kind = name.split(".")[-2]
    dim = _META_SHARD_DIM.get(kind)
    origin = shards[0].name if len(shards) == 1 else f"{shards[0].name}..{shards[-1].name}"
    if len(parts) == 1 or dim is None:  # one shard, or replicated (norms)
        return TensorRef(tuple(parts[0].shape), parts[0].dtype, lambda: parts[0], origin)
    shape = list(parts[0].shape)
    shape[dim] = sum(p.shape[dim] for p in parts)
    return TensorRef(tuple(shape), parts[0].dtype, lambda: torch.cat(parts, dim), origin)


# --- Hugging Face: config.json + *.safetensors ----------------------------------------------------

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


def _read_hf(path: Path) -> Checkpoint:
    cfg = _read_json(path / "config.json")
    origin = path / "config.json"
    if cfg.get("model_type", "llama") != "llama":
        raise LlamafastError(f"{origin} describes a {cfg['model_type']!r} model, not Llama")
    _refuse_unimplemented(cfg, origin)
    config = _config(
        {
            "dim": cfg.get("hidden_size"),
            "n_layers": cfg.get("num_hidden_layers"),
            "n_heads": cfg.get("num_attention_heads"),
            "n_kv_heads": cfg.get("num_key_value_heads"),
            "vocab_size": cfg.get("vocab_size"),
            "hidden_dim": cfg.get("intermediate_size"),
            "norm_eps": cfg.get("rms_norm_eps", 1e-5),
            "rope_theta": _rope(cfg).get("rope_theta", cfg.get("rope_theta", 10000.0)),
            "max_seq_len": cfg.get("max_position_embeddings", 4096),
        },
        origin,
        _HF_CONFIG_KEYS,
    )
    tensors = {}
    for file in _hf_files(path):
        handle = _safe_open(file)
        for key in handle.keys():
            name = _hf_to_meta(key)
            if name is not None:
                tensors[name] = _hf_ref(handle, key, name, file, config)
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


def _rope(cfg: dict) -> dict:
    """RoPE settings in either layout: transformers 5's `rope_parameters` table or the older top-level
    `rope_theta` with an optional `rope_scaling` table."""
    params = cfg.get("rope_parameters")
    if params is not None and not isinstance(params, dict):
        raise LlamafastError(f"config.json: rope_parameters must be a table, got {params!r}")
    return params or {}


def _refuse_unimplemented(cfg: dict, origin: Path) -> None:
    """Every config.json field that changes the arithmetic and that llamafast does not implement is refused
    by name; fields that do not change it (dropout, initializer_range, pretraining_tp, ...) are ignored."""
    head_dim = cfg.get("head_dim")
    heads, width = cfg.get("num_attention_heads"), cfg.get("hidden_size")
    problems = {
        "rope_parameters.rope_type": _rope(cfg).get("rope_type", _rope(cfg).get("type", "default")),
        "rope_parameters.partial_rotary_factor": _rope(cfg).get("partial_rotary_factor", 1.0),
        "rope_scaling": cfg.get("rope_scaling"),
        "attention_bias": cfg.get("attention_bias", False),
        "mlp_bias": cfg.get("mlp_bias", False),
        "sliding_window": cfg.get("sliding_window"),
        "hidden_act": cfg.get("hidden_act", "silu"),
    }
    allowed = {"rope_parameters.rope_type": ("default",), "rope_parameters.partial_rotary_factor": (1, 1.0),
               "rope_scaling": (None,), "attention_bias": (False,), "mlp_bias": (False,),
               "sliding_window": (None,), "hidden_act": ("silu",)}
    if isinstance(cfg.get("rope_scaling"), dict) and cfg["rope_scaling"].get("rope_type", "") == "default":
        problems["rope_scaling"] = None  # an explicit default is no scaling
    for key, value in problems.items():
        if value not in allowed[key]:
            raise LlamafastError(f"{origin}: {key} = {json.dumps(value)} is not supported by llamafast")
    if head_dim is not None and isinstance(heads, int) and heads > 0 and head_dim * heads != width:
        raise LlamafastError(f"{origin}: head_dim = {head_dim} is not hidden_size / num_attention_heads "
                             f"({width} / {heads}), which llamafast does not support")


def _hf_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if not index.is_file():
        return sorted(path.glob("*.safetensors"))
    weight_map = _read_json(index).get("weight_map", {})
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


def _hf_ref(handle, key: str, name: str, file: Path, config: ModelConfig) -> TensorRef:
    info = handle.get_slice(key)
    shape, dtype = tuple(info.get_shape()), _ST_DTYPES.get(info.get_dtype(), torch.float32)
    heads = {"wq": config.n_heads, "wk": config.n_kv_heads}.get(name.split(".")[-2])

    def load() -> torch.Tensor:
        t = handle.get_tensor(key)
        return _unpermute_rope(t, heads) if heads else t

    return TensorRef(shape, dtype, load, file.name)


def _unpermute_rope(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """HF stores each head's q/k rows as [even pair members..., odd...] for rotate-half RoPE; Meta interleaves."""
    rows, cols = w.shape
    d = rows // n_heads
    return w.reshape(n_heads, 2, d // 2, cols).transpose(1, 2).reshape(rows, cols)


_ST_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I8": torch.int8}


# --- llama2.c: .bin, version 0 (legacy) and version 1 ----------------------------------------------


def _llama2c_v0_header(path: Path) -> tuple[int, ...] | None:
    """The legacy header is 7 int32 and no magic: dim, hidden, layers, heads, kv heads, vocab (negative when
    the classifier is not shared), context. Taken for one when the sizes are positive and the heads divide."""
    header = _head(path, 28)
    if len(header) < 28:
        return None
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = values = struct.unpack("<7i", header)
    if min(dim, hidden, n_layers, n_heads, n_kv, seq_len, abs(vocab)) <= 0 or dim % n_heads or n_heads % n_kv:
        return None
    return values


def _llama2c_layout(c: ModelConfig, shared: bool, legacy: bool) -> list[tuple[str, int]]:
    """(name, float count) in file order; llama2.c export.py legacy_export and version1_export."""
    L, C, F, KV, V = c.n_layers, c.dim, c.hidden_dim, c.kv_dim, c.vocab_size
    per_layer = lambda key, n: [(f"layers.{i}.{key}.weight", n) for i in range(L)]  # noqa: E731
    attn = per_layer("attention.wq", C * C) + per_layer("attention.wk", KV * C) + per_layer("attention.wv", KV * C)
    attn += per_layer("attention.wo", C * C)
    ffn = per_layer("feed_forward.w1", F * C) + per_layer("feed_forward.w2", C * F) + per_layer("feed_forward.w3", F * C)
    norms = per_layer("attention_norm", C) + per_layer("ffn_norm", C)
    head = [] if shared else [("output.weight", V * C)]
    if legacy:
        rope = [("freq_cis_real", c.max_seq_len * c.head_dim // 2), ("freq_cis_imag", c.max_seq_len * c.head_dim // 2)]
        return (
            [("tok_embeddings.weight", V * C)] + norms[:L] + attn + norms[L:] + ffn + [("norm.weight", C)] + rope + head
        )
    return norms + [("norm.weight", C), ("tok_embeddings.weight", V * C)] + attn + ffn + head


def _read_llama2c(path: Path) -> Checkpoint:
    head = _head(path, 256)
    if len(head) >= 8 and struct.unpack("<I", head[:4])[0] == LLAMA2C_MAGIC:
        version = struct.unpack("<i", head[4:8])[0]
        if version != 1:
            raise LlamafastError(f"{path}: llama2.c export version {version} is not supported (only 0 and 1, fp32)")
        if len(head) < 37:
            raise LlamafastError(f"{path}: truncated llama2.c header ({len(head)} bytes)")
        dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = struct.unpack("<7i", head[8:36])
        shared, offset, legacy = bool(head[36]), 256, False
    else:
        dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = _llama2c_v0_header(path)
        shared, offset, legacy, vocab = vocab > 0, 28, True, abs(vocab)
    config = _config({"dim": dim, "n_layers": n_layers, "n_heads": n_heads, "n_kv_heads": n_kv, "vocab_size": vocab,
                      "hidden_dim": hidden, "max_seq_len": seq_len}, f"{path} (llama2.c header)")
    layout = _llama2c_layout(config, shared, legacy)
    expected, size = offset + 4 * sum(n for _, n in layout), path.stat().st_size
    if size != expected:
        raise LlamafastError(
            f"{path}: its llama2.c (version {0 if legacy else 1}) header says dim {dim}, {n_layers} layers, vocab "
            f"{vocab}, which take {expected:,} bytes, but the file has {size:,} (truncated, or not a llama2.c file)"
        )
    data = torch.from_numpy(np.memmap(path, dtype=np.float32, mode="c", offset=offset))
    tensors, at, shapes = {}, 0, expected_shapes(config)
    for name, n in layout:
        if not name.startswith("freq_cis"):
            shape = shapes[name]
            tensors[name] = TensorRef(shape, torch.float32, lambda a=at, n=n, s=shape: data[a : a + n].view(s), path.name)
        at += n
    return Checkpoint(path, "llama2c", config, tensors, None)


# --- llamafast's own: safetensors + metadata -------------------------------------------------------


def _read_llamafast(path: Path) -> Checkpoint:
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    meta = safetensors_metadata(files[0])
    if meta[LLAMAFAST_FORMAT_KEY] != "1":
        raise LlamafastError(f"{files[0]}: llamafast format version {meta[LLAMAFAST_FORMAT_KEY]} is newer than this llamafast")
    try:
        config = ModelConfig.from_dict(json.loads(meta["config"]))
    except (KeyError, TypeError, ValueError) as e:
        raise LlamafastError(f"{files[0]}: llamafast metadata has no valid config ({e})") from None
    tensors = {}
    for file in files:
        handle = _safe_open(file)
        for key in handle.keys():
            info = handle.get_slice(key)
            dtype = _ST_DTYPES.get(info.get_dtype(), torch.float32)
            tensors[key] = TensorRef(tuple(info.get_shape()), dtype, lambda h=handle, k=key: h.get_tensor(k), file.name)
    return Checkpoint(path, "llamafast", config, tensors, None, meta)


# --- shared helpers ---------------------------------------------------------------------------------


def expected_shapes(c: ModelConfig, fused: bool = False) -> dict[str, tuple[int, ...]]:
    """Meta names -> shapes; with fused=True wq/wk/wv become llamafast's wqkv."""
    C, F, KV, V = c.dim, c.hidden_dim, c.kv_dim, c.vocab_size
    shapes = {"tok_embeddings.weight": (V, C), "norm.weight": (C,), "output.weight": (V, C)}
    for i in range(c.n_layers):
        p = f"layers.{i}."
        if fused:
            shapes[p + "attention.wqkv.weight"] = (c.qkv_dim, C)
        else:
            shapes.update({p + "attention.wq.weight": (C, C), p + "attention.wk.weight": (KV, C)})
            shapes[p + "attention.wv.weight"] = (KV, C)
        shapes.update({p + "attention.wo.weight": (C, C), p + "attention_norm.weight": (C,)})
        shapes.update({p + "feed_forward.w1.weight": (F, C), p + "feed_forward.w3.weight": (F, C)})
        shapes.update({p + "feed_forward.w2.weight": (C, F), p + "ffn_norm.weight": (C,)})
    return shapes


def _config(params: dict, origin: Path | str, names: dict[str, str] | None = None) -> ModelConfig:
    try:
        return ModelConfig.from_dict({k: v for k, v in params.items() if v is not None}, names)
    except TypeError as e:
        raise LlamafastError(f"{origin}: incomplete model config ({e})") from None
    except LlamafastError as e:
        raise LlamafastError(f"{origin}: {e}") from None


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError) as e:
        raise LlamafastError(f"cannot read {path}: {e}") from None
    if not isinstance(data, dict):
        raise LlamafastError(f"{path}: expected a JSON object at the top level, got a {type(data).__name__}")
    return data


def _safe_open(file: Path):
    try:
        return safe_open(str(file), framework="pt", device="cpu")
    except (SafetensorError, OSError) as e:
        raise LlamafastError(f"corrupt or truncated safetensors file {file}: {e}") from None


def _looks_like_safetensors(head: bytes) -> bool:
    return len(head) > 9 and head[8:9] == b"{" and 2 <= struct.unpack("<Q", head[:8])[0] < 100_000_000


def safetensors_metadata(file: Path) -> dict[str, str]:
    head = _head(file, 8)
    if not _looks_like_safetensors(head + _head(file, 10)[8:]):
        return {}
    (n,) = struct.unpack("<Q", head)
    try:
        with open(file, "rb") as f:
            f.seek(8)
            return json.loads(f.read(n)).get("__metadata__") or {}
    except ValueError:
        return {}  # unreadable header: safe_open will say so with its own message
