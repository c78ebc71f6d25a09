"""SmolLM2-135M's wo (576 x 576, K tiles of 1,024) under PDL: linear_residual on float activations for each block
format named (bf16: the dense loop), at 2 rows and 1 warp and at 4 rows and 2 warps a program, compiled for an H100
(sm_90a) on a machine without a GPU (step_spills.py's stand-in driver). Counts the SASS instructions before the
first PDL wait (ACQBULK), and from the last wait to the loop's guard (the first tile: K = 576 takes no second) and
after the loop. Nothing is launched. From the repository root, with the project importable:

    python scripts/experiments/tied_wait/sass.py q4_1 q8_0 bf16

sass.txt: with blocks.diff applied (`git apply`; its first block's tree was 1f5cae6), then without it.
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
INSTRUCTION = re.compile(r"\s*/\*[0-9a-f]{4,5}\*/")


def compiled(fmt: str, block_n: int, warps: int) -> list[str]:
    w = torch.randn(N, K, dtype=torch.bfloat16)
    weight = Weight(w) if fmt == "bf16" else Weight(*quantize_blocks(w, WeightFormat(fmt)), WeightFormat(fmt), int8=True)
    cfg = GemvConfig(block_n, 1024, warps, float_blocks=fmt != "bf16")
    x, r = torch.zeros(1, K, dtype=torch.bfloat16), torch.zeros(1, N, dtype=torch.bfloat16)
    meta = {**launch_args(cfg, weight, pdl=True), "PDL": True}
    meta.pop("launch_pdl")
    scale = weight.scale if weight.scale is not None else x
    kernel = lr._linear_residual_kernel.warmup(x, weight.data, scale, r, r, N, K, weight.data.stride(0), grid=(1,),
                                               **meta)
    return sass(kernel.asm["ptx"])[1].splitlines()


def counts(fmt: str, block_n: int, warps: int) -> str:
    lines = compiled(fmt, block_n, warps)

    def n(a: int, b: int) -> int:
        return sum(1 for line in lines[a:b] if INSTRUCTION.match(line))

    waits = [i for i, line in enumerate(lines) if "ACQBULK" in line]
    guard = next(i for i in range(waits[-1], len(lines)) if INSTRUCTION.match(lines[i]) and "BRA" in lines[i])
    label = re.search(r"\((\.L_x_\d+)\)", lines[guard]).group(1)
    after = next(i for i, line in enumerate(lines) if line.strip().startswith(label + ":"))
    end = next(i for i in range(after, len(lines)) if "EXIT" in lines[i])
    tile, tail = n(waits[-1], guard), n(after, end)
    return (f"{fmt} {block_n} rows x {warps} warps: before the first wait {n(0, waits[0])}, waits {len(waits)}; "
            f"after the last: first tile {tile}, after the loop {tail}: {tile + tail}")


if __name__ == "__main__":
    driver.set_active(H100())
    for fmt in sys.argv[1:] or ["q4_1", "bf16"]:
        for block_n, warps in ((2, 1), (4, 2)):
            print(counts(fmt, block_n, warps), flush=True)
