"""rmsnorm_qkv_rope against reference.rmsnorm_qkv_rope: q, and the k/v written into the cache at pos."""

from __future__ import annotations

import pytest
import torch

from llamafast.measure.registry import REGISTRY

from .common import BLOCK_CASES, BLOCK_DTYPES, DEVICE, DTYPES, FP8, SHAPES, tolerance

SPEC = REGISTRY["rmsnorm_qkv_rope"]


@pytest.mark.parametrize("fp8", FP8, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("config", SHAPES)
@pytest.mark.parametrize("context", [1, 77])
def test_matches_reference(config, dtype, context, fp8):
    check_against_reference(config, dtype, context, fp8)


@pytest.mark.parametrize("dtype", BLOCK_DTYPES, ids=str)
@pytest.mark.parametrize("config,fmt", BLOCK_CASES)
def test_block_formats_match_reference(config, dtype, fmt):
    check_against_reference(config, dtype, 7, fmt)


def check_against_reference(config, dtype, context, fp8):
    (x, g, w, cos, sin, pos, k_cache, v_cache, eps), kw = SPEC.make_inputs(config, dtype, DEVICE, context, fp8)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    q_ref = SPEC.reference(x, g, w, cos, sin, pos, k_ref, v_ref, eps, **kw)
    q = SPEC.kernel(x, g, w, cos, sin, pos, k_cache, v_cache, eps, **kw)
    torch.testing.assert_close(q, q_ref, **tolerance(dtype))
    torch.testing.assert_close(k_cache, k_ref, **tolerance(dtype))  # position pos written, the rest untouched
    torch.testing.assert_close(v_cache, v_ref, **tolerance(dtype))


def test_writes_only_position_pos(tiny_config):
    (x, g, w, cos, sin, _, k_cache, v_cache, eps), _ = SPEC.make_inputs(tiny_config, torch.float32, DEVICE, 16)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    SPEC.kernel(x, g, w, cos, sin, torch.tensor(5, device=DEVICE), k_cache, v_cache, eps)
    changed = ((k_cache != before_k).any(-1) | (v_cache != before_v).any(-1)).any(0)  # (Smax,)
    assert changed.nonzero().flatten().tolist() == [5]
