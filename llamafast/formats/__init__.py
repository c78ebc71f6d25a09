"""Checkpoint formats: detection from the files, config, and lazy tensor references.

Every reader maps its tensors onto Meta's names (layers.{i}.attention.wq.weight, ...) and returns
TensorRefs that know their shape without reading data; weights.py validates and loads them.
Formats, one reader each: Meta (meta.py), Hugging Face (hf.py), llama2.c (llama2c.py), llama.cpp's GGUF
(gguf.py) and llamafast's own (own.py, written by writer.py).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

from llamafast.errors import LlamafastError
from llamafast.formats.common import (
    LLAMAFAST_FORMAT_KEY, Checkpoint, TensorRef, expected_shapes, looks_like_safetensors, read_head, safetensors_metadata,
)
from llamafast.formats.gguf import GGUF_MAGIC, read_gguf
from llamafast.formats.hf import read_hf
from llamafast.formats.llama2c import LLAMA2C_MAGIC, read_llama2c, v0_header
from llamafast.formats.meta import read_meta
from llamafast.formats.own import read_llamafast

__all__ = ["LLAMAFAST_FORMAT_KEY", "Checkpoint", "TensorRef", "expected_shapes", "open_checkpoint",
           "safetensors_metadata"]


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
            return read_meta
        files = sorted(path.glob("*.safetensors"))
        if files and LLAMAFAST_FORMAT_KEY in safetensors_metadata(files[0]):
            return read_llamafast
        if files and (path / "config.json").is_file():
            return read_hf
        raise LlamafastError(
            f"cannot tell the checkpoint format of {path}: expected params.json + consolidated.*.pth (Meta), "
            "config.json + *.safetensors (Hugging Face) or a llamafast checkpoint"
        )
    head = read_head(path, 32)
    if looks_like_safetensors(head):
        if LLAMAFAST_FORMAT_KEY in safetensors_metadata(path):
            return read_llamafast
        raise LlamafastError(f"{path} is a safetensors file without llamafast metadata: pass its directory")
    if head[:4] == GGUF_MAGIC:
        return read_gguf
    if head[:2] == b"PK":
        raise LlamafastError(f"{path} is a PyTorch file: pass the directory holding it with its params.json")
    if len(head) >= 8 and struct.unpack("<I", head[:4])[0] == LLAMA2C_MAGIC or v0_header(path):
        return read_llama2c
    raise LlamafastError(
        f"unknown checkpoint format: {path} (expected a directory, or a GGUF, llama2.c .bin or llamafast .safetensors file)"
    )


def _find_tokenizer(ckpt: Checkpoint, given: Path | None) -> Path | None:
    if given is not None:
        if not Path(given).is_file():
            raise LlamafastError(f"tokenizer not found: {given}")
        return Path(given)
    if ckpt.embedded_tokenizer is not None:
        return ckpt.path  # the GGUF file carries its own
    folder = ckpt.path if ckpt.path.is_dir() else ckpt.path.parent
    for name in ("tokenizer.model", f"tok{ckpt.config.vocab_size}.model", "tokenizer.json"):
        if (folder / name).is_file():
            return folder / name
    return None
