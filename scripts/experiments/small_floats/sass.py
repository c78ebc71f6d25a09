"""SmolLM2-135M's wo (576 x 576, 2 rows and 1 warp a program, K tiles of 1,024), linear_residual under PDL on
float activations (GemvConfig.float_blocks) for each block format named, and bf16, compiled for an H100 (sm_90a)
on a machine without a GPU (step_spills.py's stand-in driver); counts the SASS instructions before the PDL wait
(ACQBULK), from it to the loop's branch (the first tile: K = 576 takes no second one) and after the loop. Nothing
is launched. From the repository root, with the project importable:

    python scripts/experiments/small_floats/sass.py bf16 q4_1 q4_0 q8_0

sass.txt: the committed loop, then with runs_of_8.diff taken out, weights_first.diff (on the tree before it) and
q8_0_runs_of_8.diff applied in turn (`git apply [-R] DIFF`).
"""
import importlib
import os
import re
import sys
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from push_sass import sass  # noqa: E402
from step_spills import H100  # noqa: E402
from triton.runtime import driver  # noqa: E402

from llamafast.config import Weight, WeightFormat  # noqa: E402
from llamafast.kernels.gemv import GemvConfig, launch_args  # noqa: E402
from llamafast.quant import quantize_blocks  # noqa: E402

lr = importlib.import_module("llamafast.kernels.linear_residual")
N = K = 576


def counts(fmt: str) -> str:
    w = torch.randn(N, K, dtype=torch.bfloat16)
    weight = Weight(w) if fmt == "bf16" else Weight(*quantize_blocks(w, WeightFormat(fmt)), WeightFormat(fmt), int8=True)
    cfg = GemvConfig(2, 1024, 1, float_blocks=fmt != "bf16")
    x, r = torch.zeros(1, K, dtype=torch.bfloat16), torch.zeros(1, N, dtype=torch.bfloat16)
    meta = {**launch_args(cfg, weight, pdl=True), "PDL": True}
    meta.pop("launch_pdl")
    scale = weight.scale if weight.scale is not None else x
    kernel = lr._linear_residual_kernel.warmup(x, weight.data, scale, r, r, N, K, weight.data.stride(0), grid=(1,),
                                               **meta)
    lines = sass(kernel.asm["ptx"])[1].splitlines()

    def at(pattern: str, start: int = 0) -> int:
        return next(i for i in range(start, len(lines)) if pattern in lines[i])

    def n(a: int, b: int, op: str = "") -> int:
        return sum(1 for line in lines[a:b] if re.match(r"\s*/\*[0-9a-f]{4}\*/", line) and op in line)

    wait = at("ACQBULK")
    branch = at("BRA", wait)
    after = at(".L_x_0:", branch)
    end = at("EXIT", after)
    return (f"{fmt}: before the wait {n(0, wait)}, first tile {n(wait, branch)} ({n(wait, branch, 'SHFL')} shuffles), "
            f"after the loop {n(after, end)} ({n(after, end, 'SHFL')} shuffles): "
            f"{n(wait, branch) + n(after, end)} after the wait")


if __name__ == "__main__":
    driver.set_active(H100())
    for fmt in sys.argv[1:] or ["bf16", "q4_1"]:
        print(counts(fmt), flush=True)
