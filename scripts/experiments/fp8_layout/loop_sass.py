"""What one loop step of the H200's GEMV launches issues, in the SASS: linear_residual and rmsnorm_swiglu compiled
for sm_90a on a machine without a GPU (step_spills.py's stand-in driver) at each H200 table entry's shape; per
thread, the weights a step multiplies and the loop body's instructions, loads and FFMAs. Nothing is launched.
From the repository root, with the project importable:

    python scripts/experiments/fp8_layout/loop_sass.py
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
from llamafast.kernels.gemv import launch_args  # noqa: E402


def loop_bodies(listing: str) -> list[list[str]]:
    """The lines of each loop's path through its body: a label's lines up to the first branch, the branch back
    to it or one past a block that only some steps run; loops of more than 10 lines."""
    lines = listing.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"^(\.L_x_\d+):", line.strip()))}
    out = []
    for i, line in enumerate(lines):
        m = re.search(r"BRA `\((\.L_x_\d+)\)", line)
        if m and labels.get(m.group(1), i) < i:
            body = lines[labels[m.group(1)]:i]
            out.append(body[:next((j for j, b in enumerate(body) if "BRA" in b), len(body))])
    return [b for b in out if len(b) > 10]


def loops(listing: str) -> list[tuple[int, int, int]]:
    """(instructions, LDG, FFMA) of each loop_bodies body."""
    return [(len(b), sum("LDG" in x for x in b), sum("FFMA" in x for x in b)) for b in loop_bodies(listing)]


def compiled(name: str, key: tuple, cfg):
    """The kernel of `name` compiled at the table key's shape with launch cfg."""
    n, k, size = key
    w = torch.zeros(n, k, dtype=torch.int8 if size == 1 else torch.bfloat16)
    meta = launch_args(cfg, Weight(w, None, WeightFormat.fp8_e5m2 if size == 1 else WeightFormat.float))
    x, row = torch.zeros(1, k, dtype=torch.bfloat16), torch.zeros(1, n, dtype=torch.bfloat16)
    mod = importlib.import_module(f"llamafast.kernels.{name}")
    if name == "linear_residual":
        return mod._linear_residual_kernel.warmup(x, w, w, row, row, n, k, k, grid=(1,), **meta)
    return mod._rmsnorm_swiglu_kernel.warmup(x, x, w, w, w, w, row, n, k, k, 1e-5, grid=(1,), **meta)


def main() -> None:
    driver.set_active(H100())
    for name, pair in (("linear_residual", 1), ("rmsnorm_swiglu", 2)):
        for key, cfg in importlib.import_module(f"llamafast.kernels.{name}").H200.items():
            if len(key) != 3:
                continue
            registers, listing = sass(compiled(name, key, cfg).asm["ptx"])
            per_thread = cfg.block_n * cfg.block_k * pair // (32 * cfg.num_warps)
            body = loops(listing)
            per_weight = f"{body[0][0] / per_thread:.2f}" if body else "-"
            print(f"{name} {key} {cfg.block_n}x{cfg.block_k}/{cfg.num_warps}: {registers.split(':')[-1].strip()}; "
                  f"{per_thread} weights a thread a step; loop (instructions, LDG, FFMA) {body}; "
                  f"{per_weight} instructions a weight")


if __name__ == "__main__":
    main()
