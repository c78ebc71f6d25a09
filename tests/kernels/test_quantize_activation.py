"""kernels/quantize_activation.py against quant.int8_blocks: the same integers, scales, block sums and x^2 sums,
bit for bit, on lengths that fill no whole tile and longer than one, blocks of zeros and ties included."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from llamafast.config import BLOCK_FORMATS, Weight, WeightFormat
from llamafast.quant import int8_blocks

from .common import DEVICE


def _parts(ws: torch.Tensor, k: int):
    nb = k // 32
    q = ws[:k].float()
    d = ws[k:k + 4 * nb].view(torch.float32)
    s = ws[k + 4 * nb:k + 8 * nb].view(torch.int32)
    ss = ws[k + 8 * nb:k + 12 * nb].view(torch.float32)
    return q, d, s, ss


@pytest.mark.parametrize("k", [32, 352, 2080, *[pytest.param(k, marks=pytest.mark.gpu) for k in (4096, 11008)]])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("norm", [False, True])
def test_int8_activation_matches_reference(k, dtype, norm):
    from llamafast.kernels.quantize_activation import int8_activation

    gen = torch.Generator().manual_seed(k)
    x = (torch.randn(1, k, generator=gen) * 3).to(dtype)
    x[0, 32:64] = 0  # a block of zeros: scale 0, integers 0
    x[0, 0] = 127 / 2  # with amax 127 in its block, 63.5 is a tie: rounds to even
    x[0, 1] = 127.0
    g = (torch.rand(k, generator=gen) + 0.5).to(dtype)
    ws = int8_activation(x.to(DEVICE), g.to(DEVICE) if norm else None).cpu()
    v = x.float() * g.float() if norm else x.float()
    q, d, s, ss = _parts(ws, k)
    assert torch.equal(q * d.repeat_interleave(32), int8_blocks(v)[0])
    amax = v.view(-1, 32).abs().amax(1)
    assert torch.equal(d, amax / 127)
    assert torch.equal(s, q.view(-1, 32).sum(1).int())
    assert q.abs().max() == 127 and (q.view(-1, 32)[1:2] == 0).all()
    if not norm:
        assert q[0] == 64 and q[1] == 127  # 63.5 -> 64: ties to even
    if norm:
        torch.testing.assert_close(ss, x.float().pow(2).view(-1, 32).sum(1), rtol=1e-5, atol=0)


def test_int8_blocks_error_is_within_half_a_step():
    x = torch.randn(4, 256) * torch.logspace(-3, 3, 256)
    blocks = x.view(4, 8, 32)
    step = blocks.abs().amax(-1, keepdim=True) / 127
    err = (int8_blocks(x).view(4, 8, 32) - blocks).abs()
    assert (err <= step / 2 * (1 + 1e-6)).all() and (err > 0).any()


@pytest.mark.parametrize(("fmt", "tail", "expected"), [
    *[(WeightFormat(f), None, True) for f in BLOCK_FORMATS],
    (WeightFormat.q4_0, WeightFormat.q8_0, True), (WeightFormat.q4_k, WeightFormat.q6_k, True),
    (WeightFormat.float, None, False), (WeightFormat.fp8_e5m2, None, False), (WeightFormat.fp8_e4m3, None, False),
])
def test_which_weights_take_int8_activations(fmt, tail, expected):
    t = Weight(torch.zeros(2, 16, dtype=torch.uint8), None, tail) if tail is not None else None
    w = Weight(torch.zeros(2, 16, dtype=torch.uint8), None, fmt, t, int8=True)
    assert w.int8_activations == expected
    assert not dataclasses.replace(w, int8=False).int8_activations  # unasked (the reference backend's): float
