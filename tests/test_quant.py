"""FP8 quantization: rounding against an independent oracle, saturation, scales, and the error it costs."""

from __future__ import annotations

import pytest
import torch

from llamafast.config import WeightFormat
from llamafast.quant import E4M3_MAX, E5M2_MAX, FP8Format, dequantize, quantize

E5M2 = WeightFormat.fp8_e5m2


def _e5m2_values() -> torch.Tensor:
    """All finite E5M2 values from their bit layout (1 sign, 5 exponent bits with bias 15, 2 mantissa bits)."""
    vals = []
    for code in range(256):
        sign, exp, man = code >> 7, (code >> 2) & 0x1F, code & 3
        if exp == 0x1F:
            continue  # inf and NaN
        mag = (man / 4) * 2.0**-14 if exp == 0 else (1 + man / 4) * 2.0 ** (exp - 15)
        vals.append((-mag if sign else mag, code))
    return vals


def _round_e5m2(x: torch.Tensor) -> torch.Tensor:
    """Nearest E5M2 value, ties to the even code (even mantissa), by brute force over all 248 finite values."""
    table = _e5m2_values()
    values = torch.tensor([v for v, _ in table], dtype=torch.float64)
    even = torch.tensor([c % 2 == 0 for _, c in table])
    dist = (x.double()[:, None] - values[None, :]).abs()
    best = dist.min(dim=1, keepdim=True).values
    tied = dist == best
    pick = torch.where(tied & even[None, :], 1, 0) + tied.int()  # prefer an even code among the nearest
    return values[pick.argmax(dim=1)]


def test_e5m2_rounds_to_nearest_even():
    # Gaussian values, exact midpoints between neighbours, and subnormals.
    x = torch.cat([torch.randn(4000) * 0.05, torch.tensor([1.125, 1.375, 3.5, -1.625, 2.0**-16 * 1.5, 5e-6])])
    q, scale, stats = quantize(x[None, :], FP8Format.e5m2)
    assert scale is None and stats.saturated == 0
    torch.testing.assert_close(dequantize(q, None, torch.float64, E5M2)[0], _round_e5m2(x), atol=0, rtol=0)


def test_bf16_source_rounds_like_its_exact_value():
    w = (torch.randn(64, 64) * 0.02).bfloat16()
    q_bf16, _, _ = quantize(w, FP8Format.e5m2)
    torch.testing.assert_close(dequantize(q_bf16, None, torch.float64, E5M2).flatten(), _round_e5m2(w.double().flatten()),
                               atol=0, rtol=0)


def test_e5m2_saturates_and_counts():
    w = torch.tensor([[1.0, 6e4, -7e4, 1e9, 57344.0]])
    q, _, stats = quantize(w, FP8Format.e5m2)
    assert stats.saturated == 3
    assert dequantize(q, None, torch.float32, E5M2).tolist() == [[1.0, E5M2_MAX, -E5M2_MAX, E5M2_MAX, E5M2_MAX]]


def test_e4m3_scales_each_row_to_its_maximum():
    w = torch.randn(16, 256) * torch.logspace(-3, 1, 16)[:, None]
    w[3] = 0.0  # an all-zero row keeps a finite scale
    q, scale, stats = quantize(w, FP8Format.e4m3)
    assert scale.shape == (16,) and scale.dtype == torch.float32 and torch.isfinite(scale).all()
    deq = dequantize(q, scale, torch.float32, WeightFormat.fp8_e4m3)
    torch.testing.assert_close(deq.abs().amax(dim=1)[w.abs().amax(dim=1) > 0], w.abs().amax(dim=1)[w.abs().amax(dim=1) > 0])
    assert (q.view(torch.float8_e4m3fn).float().abs().amax(dim=1)[w.abs().amax(dim=1) > 0] == E4M3_MAX).all()
    assert torch.equal(deq[3], w[3]) and stats.saturated == 0


def test_error_statistics_match_the_formats():
    """Gaussian weights: E5M2 has 2 mantissa bits (max rounding error 1/9 at 1.125), E4M3 3 bits (1/17)."""
    w = torch.randn(512, 1024) * 0.02
    _, _, e5 = quantize(w, FP8Format.e5m2)
    _, _, e4 = quantize(w, FP8Format.e4m3)
    assert e5.max_rel_err == pytest.approx(1 / 9, rel=1e-3) and e4.max_rel_err == pytest.approx(1 / 17, rel=1e-3)
    assert 0.035 < e5.mean_rel_err < 0.055 and 0.015 < e4.mean_rel_err < 0.03
    assert e4.mean_rel_err < 0.6 * e5.mean_rel_err


def test_dequantize_passes_floats_through_and_checks_the_format():
    w = torch.randn(4, 4)
    assert dequantize(w, None, torch.bfloat16, WeightFormat.float) is w
    with pytest.raises(AssertionError, match="fp8_e5m2 weights stored as torch.float32"):
        dequantize(w, None, torch.bfloat16, E5M2)


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_0", "Q4_1"])
def test_blocks_equal_gguf_py_bit_for_bit(kind):
    """quantize_blocks gives gguf-py's blocks (repacked: to_gguf_blocks), dequantize gives gguf-py's floats, and
    the repacking goes both ways; zero blocks and ties of magnitude included."""
    import numpy as np
    from gguf import GGMLQuantizationType, quants

    from llamafast.config import WeightFormat
    from llamafast.quant import dequantize, from_gguf_blocks, quantize_blocks, to_gguf_blocks

    fmt, qtype = WeightFormat(kind.lower()), GGMLQuantizationType[kind]
    w = torch.randn(37, 160, generator=torch.Generator().manual_seed(0)) * 0.05
    w[0, :32], w[1, 5], w[1, 6] = 0.0, 3.0, -3.0
    theirs = quants.quantize(w.numpy(), qtype)
    data, scale = quantize_blocks(w, fmt)
    assert np.array_equal(to_gguf_blocks(data, scale, fmt).numpy(), theirs)
    back = from_gguf_blocks(torch.from_numpy(theirs), fmt)
    assert torch.equal(back[0], data) and torch.equal(back[1], scale)
    assert np.array_equal(dequantize(data, scale, torch.float32, fmt).numpy(), quants.dequantize(theirs, qtype))


def test_blocks_refuse_partial_rows():
    from llamafast.config import WeightFormat
    from llamafast.errors import LlamafastError
    from llamafast.quant import quantize_blocks

    with pytest.raises(LlamafastError, match="whole 32-weight blocks"):
        quantize_blocks(torch.randn(4, 48), WeightFormat.q4_0)
