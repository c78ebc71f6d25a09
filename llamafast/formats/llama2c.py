"""llama2.c's .bin format, version 0 (legacy: 7 int32, no magic) and version 1 (256-byte header), fp32."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import torch

from llamafast.config import ModelConfig
from llamafast.errors import LlamafastError
from llamafast.formats.common import Checkpoint, TensorRef, config_from, expected_shapes, read_head

LLAMA2C_MAGIC = 0x616B3432  # "ak42", the header of llama2.c's versioned exports


def v0_header(path: Path) -> tuple[int, ...] | None:
    """The legacy header is 7 int32 and no magic: dim, hidden, layers, heads, kv heads, vocab (negative when
    the classifier is not shared), context. Taken for one when the sizes are positive and the heads divide."""
    header = read_head(path, 28)
    if len(header) < 28:
        return None
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = values = struct.unpack("<7i", header)
    if min(dim, hidden, n_layers, n_heads, n_kv, seq_len, abs(vocab)) <= 0 or dim % n_heads or n_heads % n_kv:
        return None
    return values


def _layout(c: ModelConfig, shared: bool, legacy: bool) -> list[tuple[str, int]]:
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


def read_llama2c(path: Path) -> Checkpoint:
    start = read_head(path, 256)
    if len(start) >= 8 and struct.unpack("<I", start[:4])[0] == LLAMA2C_MAGIC:
        version = struct.unpack("<i", start[4:8])[0]
        if version != 1:
            raise LlamafastError(f"{path}: llama2.c export version {version} is not supported (only 0 and 1, fp32)")
        if len(start) < 37:
            raise LlamafastError(f"{path}: truncated llama2.c header ({len(start)} bytes)")
        dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = struct.unpack("<7i", start[8:36])
        shared, offset, legacy = bool(start[36]), 256, False
    else:
        dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = v0_header(path)
        shared, offset, legacy, vocab = vocab > 0, 28, True, abs(vocab)
    config = config_from({"dim": dim, "n_layers": n_layers, "n_heads": n_heads, "n_kv_heads": n_kv, "vocab_size": vocab,
                      "hidden_dim": hidden, "max_seq_len": seq_len}, f"{path} (llama2.c header)")
    layout = _layout(config, shared, legacy)
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
