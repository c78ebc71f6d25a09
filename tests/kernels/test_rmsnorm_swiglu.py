"""rmsnorm_swiglu against reference.rmsnorm_swiglu."""

from __future__ import annotations

import pytest
import torch

from llamafast.kernels import REGISTRY

from .common import DEVICE, DTYPES, FP8, SHAPES, tolerance

SPEC = REGISTRY["rmsnorm_swiglu"]


@pytest.mark.parametrize("fp8", FP8, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("config", SHAPES)
def test_matches_reference(config, dtype, fp8):
    args, kw = SPEC.make_inputs(config, dtype, DEVICE, 1, fp8)
    torch.testing.assert_close(SPEC.kernel(*args, **kw), SPEC.reference(*args, **kw), **tolerance(dtype))
