"""rmsnorm_lm_head against reference.rmsnorm_lm_head (fp32 logits)."""

from __future__ import annotations

import pytest
import torch

from llamafast.kernels import REGISTRY

from .common import DEVICE, DTYPES, SHAPES, tolerance

SPEC = REGISTRY["rmsnorm_lm_head"]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("config", SHAPES)
def test_matches_reference(config, dtype):
    args = SPEC.make_inputs(config, dtype, DEVICE, 1)
    torch.testing.assert_close(SPEC.kernel(*args), SPEC.reference(*args), **tolerance(dtype))
