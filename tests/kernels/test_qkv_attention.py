"""qkv_attention against reference.qkv_attention (rmsnorm_qkv_rope, then SDPA over the masked cache): its output and
the k and v it wrote, for float, FP8 and block weights, GQA groups of 1, 2 and 8, at lengths around the tail walk's
blocks and past SHORT_LEN (the kernel is exact at any length; the host keeps it to short ones for speed)."""

from __future__ import annotations

import pytest
import torch

from llamafast.config import Weight
from llamafast.kernels.decode_attention import tickets
from llamafast.kernels.qkv_attention import BLOCK_S, SHORT_LEN
from llamafast.measure.registry import REGISTRY, weight

from .common import BLOCK_CASES, DEVICE, DOT_DTYPES, FP8, ODD, SHAPES, tolerance

SPEC = REGISTRY["qkv_attention"]


@pytest.mark.parametrize("fp8", FP8, ids=str)
@pytest.mark.parametrize("dtype", DOT_DTYPES, ids=str)
@pytest.mark.parametrize("config", SHAPES)
@pytest.mark.parametrize("context", [1, BLOCK_S + 1, 77])
def test_matches_reference(config, dtype, context, fp8):
    check(config, dtype, context, fp8)


# Q4_0 on int8 activations with masked tiles (k160), Q4_K's super-blocks (k256), and every format at 7B on a GPU.
@pytest.mark.parametrize("config,fmt", [p for p in BLOCK_CASES if p.marks or p.id in ("k160-q4_0", "k256-q4_k")])
def test_block_formats_match_reference(config, fmt):
    check(config, torch.float32, 9, fmt)


def test_v_rows_in_a_second_format_match_reference():
    """A Q4_K_M layer's wv in Q6_K (Weight.tail): the tail's tiles take tickets on the v heads as the head's do."""
    from .test_rmsnorm_qkv_rope import MIXED

    config, fmt, v_fmt = MIXED[0].values
    (x, g, w, cos, sin, pos, k_cache, v_cache, eps), _ = SPEC.make_inputs(config, torch.float32, DEVICE, 7, None)
    head = weight(config.dim + config.kv_dim, config.dim, torch.float32, DEVICE, fmt)
    mixed = Weight(head.data, head.scale, fmt, tail=weight(config.kv_dim, config.dim, torch.float32, DEVICE, v_fmt),
                   int8=True)
    check(config, torch.float32, 7, None, (x, g, mixed, cos, sin, pos, k_cache, v_cache, eps))


@pytest.mark.parametrize("context", [SHORT_LEN, SHORT_LEN + BLOCK_S + 3])
def test_exact_past_the_short_length(context):
    check(ODD, torch.float32, context, None)


def test_tickets_are_left_at_zero(tiny_config):
    """Twice in a row through the same tickets: each KV head's last tile resets its own."""
    args, _ = SPEC.make_inputs(tiny_config, torch.float32, DEVICE, 12)
    first = SPEC.kernel(*args)
    assert not tickets(DEVICE, tiny_config.n_kv_heads, "qkv_attention").any()
    torch.testing.assert_close(SPEC.kernel(*args), first, atol=0, rtol=0)


def check(config, dtype, context, fp8, inputs=None):
    args, _ = (inputs, None) if inputs else SPEC.make_inputs(config, dtype, DEVICE, context, fp8)
    x, g, w, cos, sin, pos, k_cache, v_cache, eps = args
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    want = SPEC.reference(x, g, w, cos, sin, pos, k_ref, v_ref, eps)
    got = SPEC.kernel(x, g, w, cos, sin, pos, k_cache, v_cache, eps)
    torch.testing.assert_close(got, want, **tolerance(dtype))
    torch.testing.assert_close(k_cache, k_ref, **tolerance(dtype))
    torch.testing.assert_close(v_cache, v_ref, **tolerance(dtype))
