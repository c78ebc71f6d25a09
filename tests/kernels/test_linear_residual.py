"""linear_residual against reference.linear_residual at the output (wo) and down (w2) projection shapes."""

from __future__ import annotations

import pytest

from llamafast.measure.registry import REGISTRY

from .common import DTYPES, FP8, SHAPES, assert_matches_reference


@pytest.mark.parametrize("site", ["linear_residual[wo]", "linear_residual[w2]"])
@pytest.mark.parametrize("fp8", FP8, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("config", SHAPES)
def test_matches_reference(config, dtype, site, fp8):
    assert_matches_reference(REGISTRY[site], config, dtype, fp8)
