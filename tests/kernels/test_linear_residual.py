"""linear_residual against reference.linear_residual at the output (wo) and down (w2) projection shapes."""

from __future__ import annotations

import pytest
import torch

from llamafast.kernels import REGISTRY

from .common import DEVICE, DTYPES, FP8, SHAPES, tolerance


@pytest.mark.parametrize("site", ["linear_residual[wo]", "linear_residual[w2]"])
@pytest.mark.parametrize("fp8", FP8, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("config", SHAPES)
def test_matches_reference(config, dtype, site, fp8):
    spec = REGISTRY[site]
    args, kw = spec.make_inputs(config, dtype, DEVICE, 1, fp8)
    torch.testing.assert_close(spec.kernel(*args, **kw), spec.reference(*args, **kw), **tolerance(dtype))
