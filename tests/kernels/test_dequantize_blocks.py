"""kernels/dequantize_blocks.py against llamafast.quant.dequantize_blocks (gguf-py's values), odd shapes, each
output dtype."""

from __future__ import annotations

import pytest
import torch

from llamafast.config import Weight, WeightFormat
from llamafast.kernels import dequantize_blocks
from llamafast.quant import dequantize_blocks as reference, quantize_blocks

from .common import DEVICE

BLOCKS = [WeightFormat.q8_0, WeightFormat.q4_0, WeightFormat.q4_1]
K_QUANTS = [WeightFormat.q4_k, WeightFormat.q5_k, WeightFormat.q6_k]
# Odd shapes: N no multiple of BLOCK_N, K no multiple of BLOCK_K (the K-quants' in whole 256-weight super-blocks).
CASES = [(fmt, n, k) for fmt in BLOCKS for n, k in [(37, 96), (16, 256), (5, 544)]] + \
        [(fmt, n, k) for fmt in K_QUANTS for n, k in [(37, 256), (5, 768)]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("fmt,n,k", CASES, ids=lambda v: v.value if isinstance(v, WeightFormat) else str(v))
def test_matches_the_reference(n, k, fmt, dtype):
    torch.manual_seed(0)
    data, scale = quantize_blocks(torch.randn(n, k, device=DEVICE), fmt)
    got = dequantize_blocks(Weight(data, scale, fmt), dtype)
    assert got.dtype == dtype and got.shape == (n, k)
    want = reference(data, scale, fmt).to(dtype)
    if dtype == torch.bfloat16:  # Triton's interpreter rounds fp32 to bf16 its own way: one step either side
        torch.testing.assert_close(got, want, rtol=2**-7, atol=0)
    else:
        assert torch.equal(got, want)
