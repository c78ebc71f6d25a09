"""rmsnorm_swiglu against reference.rmsnorm_swiglu."""

from __future__ import annotations

import pytest

from llamafast.measure.registry import REGISTRY

from .common import DTYPES, FP8, SHAPES, assert_matches_reference

SPEC = REGISTRY["rmsnorm_swiglu"]


@pytest.mark.parametrize("fp8", FP8, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("config", SHAPES)
def test_matches_reference(config, dtype, fp8):
    assert_matches_reference(SPEC, config, dtype, fp8)
