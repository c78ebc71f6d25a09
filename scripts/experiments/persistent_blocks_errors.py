"""Relative logit errors at SmolLM2's shape (random weights, 30 layers by default), Q4_1 blocks on int8
activations, against the reference path's exact model of that arithmetic: the persistent step at three launches
and the per-op graph, in fp32 and bf16, 16 steps after a 16-token prompt. On a GPU, from the repository root:

    PYTHONPATH=. python scripts/experiments/persistent_blocks_errors.py [LAYERS]
"""
import sys
import torch
sys.path.insert(0, ".")
from tests.kernels.test_decode_step import _twins, _step_errors, _layers
from llamafast.config import WeightFormat
from llamafast.kernels.decode_step_plan import StepConfig

cfg = _layers("smollm2-135m", int(sys.argv[1]) if len(sys.argv) > 1 else 30)
for dtype in (torch.float32, torch.bfloat16):
    for fmt in (WeightFormat.q4_1,):
        ref, fused = _twins(cfg, dtype, None, fmt)
        for name, launch in (("default", None), ("stages1", StepConfig((16, 1024), (8, 1024), (8, 1024), (8, 1024), 4, 3, 168, 1)),
                             ("bk512", StepConfig((16, 512), (8, 512), (8, 512), (8, 512), 4, 3, 168, 2))):
            if launch is not None:
                fused.backend.launches["decode_step"][(cfg.dim, cfg.hidden_dim, fmt.value)] = launch
                fused._decode_step = None
            e = _step_errors(ref, fused, steps=16, prompt=16)
            print(dtype, fmt.value, name, f"max {max(e):.2e} first {e[:3]}", flush=True)
    per_op = _twins(cfg, dtype, None, WeightFormat.q4_1)
    from llamafast.backends import with_backend
    from llamafast.config import Backend
    tri = with_backend(per_op[1], Backend.triton)
    e = _step_errors(per_op[0], tri, steps=16, prompt=16)
    print(dtype, "q4_1 per-op triton", f"max {max(e):.2e}", flush=True)
