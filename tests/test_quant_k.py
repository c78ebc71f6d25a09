"""The K-quants (Q4_K, Q5_K, Q6_K): GGUF's bytes repacked into the kernels' layout read back as gguf-py's
dequantizer reads the file, bit for bit; bench's plain-rounding quantizer; refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from llamafast.config import WeightFormat
from llamafast.errors import LlamafastError
from llamafast.quant import dequantize, from_gguf_blocks, quantize_blocks

K_QUANTS = ["Q4_K", "Q5_K", "Q6_K"]
_SCALES = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}  # byte offsets of the fp16 d (and dmin)


def random_blocks(kind: str, rows: int, k: int, seed: int = 0) -> np.ndarray:
    """Every byte random but the fp16 scale fields: finite, of either sign, some zero."""
    fmt = WeightFormat(kind.lower())
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (rows, k // 256, fmt.bytes_per_block()), dtype=np.uint8)
    for at in _SCALES[kind]:
        d = rng.uniform(-0.01, 0.01, (rows, k // 256)).astype(np.float16)
        d[0, 0] = 0.0
        blocks[..., at:at + 2] = d.view(np.uint8).reshape(rows, k // 256, 2)
    return blocks.reshape(rows, -1)


@pytest.mark.parametrize("kind", K_QUANTS)
def test_repacked_blocks_dequantize_as_gguf_py(kind):
    from gguf import GGMLQuantizationType, quants

    fmt, rows, k = WeightFormat(kind.lower()), 7, 768
    raw = random_blocks(kind, rows, k)
    data, scale = from_gguf_blocks(torch.from_numpy(raw), fmt)
    assert data.dtype == torch.uint8 and data.shape == (rows, fmt.stored_cols(k))
    assert scale.dtype == torch.int16 and tuple(scale.shape) == fmt.scale_shape(rows, k)
    assert fmt.stored_bytes(rows, k) == data.numel() + 2 * scale.numel()
    ours = dequantize(data, scale, torch.float32, fmt).numpy()
    theirs = quants.dequantize(raw, GGMLQuantizationType[kind]).reshape(rows, k)
    assert np.array_equal(ours.view(np.uint32), theirs.astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("kind,bound", [("Q4_K", 0.12), ("Q5_K", 0.06), ("Q6_K", 0.03)])
def test_bench_quantizer_rounds_to_the_blocks_range(kind, bound):
    """quantize_k (bench's random weights): relative RMS error within the format's reach, zero rows stay zero,
    and its blocks are the layout the reader makes (dequantize reads them)."""
    fmt = WeightFormat(kind.lower())
    w = torch.randn(9, 512, generator=torch.Generator().manual_seed(1)) * 0.02
    w[0] = 0.0
    data, scale = quantize_blocks(w, fmt)
    assert data.shape == (9, fmt.stored_cols(512)) and tuple(scale.shape) == fmt.scale_shape(9, 512)
    back = dequantize(data, scale, torch.float32, fmt)
    assert torch.equal(back[0], torch.zeros(512))
    err = (back - w).pow(2).mean().sqrt() / w.pow(2).mean().sqrt()
    assert err < bound


def test_k_quants_refuse_partial_super_blocks():
    with pytest.raises(LlamafastError, match="whole 256-weight blocks"):
        quantize_blocks(torch.randn(4, 288), WeightFormat.q4_k)
