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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("fmt", BLOCKS, ids=lambda f: f.value)
@pytest.mark.parametrize("n,k", [(37, 96), (16, 256), (5, 544)])
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
