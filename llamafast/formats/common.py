"""What every checkpoint reader shares: lazy tensor references, the Checkpoint they fill, the shapes a config
implies, and small readers for JSON, safetensors headers and file heads that fail with one-line errors."""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from llamafast.config import ModelConfig, SparseLayout, WeightFormat
from llamafast.errors import LlamafastError

Progress = Callable[[int, int], None]  # (bytes done, bytes total)
LLAMAFAST_FORMAT_KEY = "llamafast_format"  # safetensors metadata key; its value is the format version
LLAMA2C_MAGIC = 0x616B3432  # "ak42", the header of llama2.c's versioned exports


Narrow = Callable[[int, int, int], torch.Tensor]  # (dim, start, length) -> that slice, as a CPU tensor


@dataclass
class TensorRef:
    shape: tuple[int, ...]
    dtype: torch.dtype
    load: Callable[[], torch.Tensor]  # returns a CPU tensor, memory-mapped where the format allows
    origin: str  # file name, for error messages
    # A slice read without the whole tensor (tensor-parallel ranks read only theirs). By default load()'s result
    # is narrowed: a view of a memory map then reads only the slice's pages when it is copied.
    narrow: Narrow | None = None
    # A block format (GGUF's kept blocks): load() gives the file's bytes, (rows, blocks * bytes per block) uint8,
    # while shape stays (rows, weights per row).
    fmt: WeightFormat = WeightFormat.float

    def __post_init__(self) -> None:
        if self.narrow is None:
            self.narrow = lambda dim, start, length: self.load().narrow(dim, start, length)


def safetensors_narrow(handle, key: str) -> Narrow:
    """Reads just the slice from the file, through safetensors' lazy slices."""

    def narrow(dim: int, start: int, length: int) -> torch.Tensor:
        index = (slice(None),) * dim + (slice(start, start + length),)
        return handle.get_slice(key)[index]

    return narrow


def safetensors_views(file: Path) -> dict[str, Callable[[], torch.Tensor]]:
    """Per tensor, a loader of a zero-copy view into the memory-mapped file (safetensors' get_tensor copies
    while holding the GIL, so reader threads (load/staging.py) could not overlap it). Where the header cannot be
    read this way, {}: safe_open's loaders are used and give their own errors."""
    import mmap

    try:
        with open(file, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)  # copy-on-write, as torch.load(mmap=True)
    except (OSError, ValueError, struct.error):
        return {}
    views = {}
    for key, info in header.items():
        dtype = ST_DTYPES.get(info.get("dtype")) if isinstance(info, dict) else None
        if dtype is None or key == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        if 8 + n + end > len(mapped) or (end - begin) % dtype.itemsize:
            return {}

        def view(dtype=dtype, shape=tuple(info["shape"]), offset=8 + n + begin, count=(end - begin) // dtype.itemsize):
            return torch.frombuffer(mapped, dtype=dtype, count=count, offset=offset).view(shape)

        views[key] = view
    return views


@dataclass
class Checkpoint:
    path: Path
    format: str  # "meta" | "hf" | "llama2c" | "llamafast" | "gguf"
    config: ModelConfig
    tensors: dict[str, TensorRef]  # Meta names (llamafast: its stored names)
    tokenizer: Path | None
    metadata: dict[str, str] = field(default_factory=dict)  # llamafast format: weights, source, ...
    embedded_tokenizer: dict | None = None  # GGUF: the tokenizer and chat template inside the file
    tied_head: TensorRef | None = None  # GGUF: a tied LM head as the embedding table's blocks (formats.gguf)


def read_head(path: Path, n: int) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except OSError as e:
        raise LlamafastError(f"cannot read {path}: {e.strerror}") from None


ST_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I8": torch.int8, "U8": torch.uint8}


def expected_shapes(c: ModelConfig, fused: bool = False, layout: SparseLayout | None = None) -> dict[str, tuple[int, ...]]:
    """Meta names -> shapes; with fused=True wq/wk/wv become llamafast's wqkv; with a sparse layout the FFN is
    stored as model.FeedForward says (w2t, router, router_bias, thresholds)."""
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
        if layout is not None:
            n = layout.n_groups(F)
            del shapes[p + "feed_forward.w2.weight"]
            shapes.update({p + "feed_forward.w2t.weight": (F, C), p + "feed_forward.router.weight": (n, C)})
            shapes.update({p + "feed_forward.router_bias": (n,), p + "feed_forward.thresholds": (2, len(layout.levels))})
    return shapes


def config_from(params: dict, origin: Path | str, names: dict[str, str] | None = None) -> ModelConfig:
    try:
        return ModelConfig.from_dict({k: v for k, v in params.items() if v is not None}, names)
    except TypeError as e:
        raise LlamafastError(f"{origin}: incomplete model config ({e})") from None
    except LlamafastError as e:
        raise LlamafastError(f"{origin}: {e}") from None


def read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError) as e:
        raise LlamafastError(f"cannot read {path}: {e}") from None
    if not isinstance(data, dict):
        raise LlamafastError(f"{path}: expected a JSON object at the top level, got a {type(data).__name__}")
    return data


def open_safetensors(file: Path):
    if not _is_utf8(str(file)):
        return _open_by_descriptor(file)
    try:
        return safe_open(str(file), framework="pt", device="cpu")
    except (SafetensorError, OSError) as e:
        raise LlamafastError(f"corrupt or truncated safetensors file {file}: {e}") from None


def _open_by_descriptor(file: Path):
    """safetensors opens only UTF-8 paths; a directory named in another encoding (Latin-1 `m\xe9`) is reached
    through the descriptor's /proc/self/fd name, which is ASCII (Linux)."""
    try:
        fd = os.open(file, os.O_RDONLY)
    except OSError as e:
        raise LlamafastError(f"cannot read {file}: {e.strerror}") from None
    try:
        if os.path.isdir("/proc/self/fd"):
            return open_safetensors(Path(f"/proc/self/fd/{fd}"))
    finally:
        os.close(fd)  # safe_open holds its own descriptor and memory map
    raise LlamafastError(f"cannot open {file}: its path is not UTF-8, and safetensors opens only UTF-8 paths; "
                         "rename the directory")


def _is_utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # bytes that are not UTF-8 are decoded to lone surrogates
        return False
    return True


def looks_like_safetensors(head: bytes) -> bool:
    return len(head) > 9 and head[8:9] == b"{" and 2 <= struct.unpack("<Q", head[:8])[0] < 100_000_000


def safetensors_metadata(file: Path) -> dict[str, str]:
    head = read_head(file, 8)
    if not looks_like_safetensors(head + read_head(file, 10)[8:]):
        return {}
    (n,) = struct.unpack("<Q", head)
    try:
        with open(file, "rb") as f:
            f.seek(8)
            return json.loads(f.read(n)).get("__metadata__") or {}
    except ValueError:
        return {}  # unreadable header: safe_open will say so with its own message


def nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    n = dtype.itemsize
    for s in shape:
        n *= s
    return n
