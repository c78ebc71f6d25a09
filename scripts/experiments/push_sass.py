"""What a tensor-parallel producer program runs after its GEMV, in the SASS: kernels/tp_sync.py's push_linear
compiled for an H100 (sm_90a) on a machine without a GPU (step_spills.py's stand-in driver), at Llama-2-7B's TP=2
wo shard (4,096 x 2,048, bf16, 4 rows and 2 warps a program), its stores, fences and atomics listed in order.
Nothing is launched. From the repository root, with the project importable:

    python scripts/experiments/push_sass.py
"""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from step_spills import H100  # noqa: E402
from triton.backends.nvidia.compiler import get_ptxas  # noqa: E402
from triton.runtime import driver  # noqa: E402

from llamafast.config import Weight  # noqa: E402
from llamafast.kernels import tp_sync  # noqa: E402
from llamafast.kernels.gemv import GemvConfig, launch_args  # noqa: E402

ORDERING = ("STG", "MEMBAR", "ERRBAR", "ATOMG", "RED", "CCTL", "FENCE")


def sass(ptx: str) -> tuple[str, str]:
    """(ptxas's register line, nvdisasm's listing) of a kernel's PTX, for sm_90a."""
    ptxas = get_ptxas(90).path
    with tempfile.TemporaryDirectory() as d:
        src, cubin = os.path.join(d, "k.ptx"), os.path.join(d, "k.cubin")
        Path(src).write_text(ptx)
        info = subprocess.run([ptxas, "-v", "--gpu-name=sm_90a", src, "-o", cubin], capture_output=True, text=True)
        listing = subprocess.run([os.path.join(os.path.dirname(ptxas), "nvdisasm"), "-c", cubin],
                                 capture_output=True, text=True, check=True).stdout
    return next(line for line in info.stderr.splitlines() if "registers" in line).strip(), listing


def main() -> None:
    driver.set_active(H100())
    n, k = 4096, 2048
    w, x = torch.zeros(n, k, dtype=torch.bfloat16), torch.zeros(1, k, dtype=torch.bfloat16)
    table, counters = torch.zeros(2, dtype=torch.int64), torch.zeros(4, dtype=torch.int32)
    meta = launch_args(GemvConfig(4, 1024, 2), Weight(w))
    kernel = tp_sync._push_linear_kernel.warmup(x, w, w, table, table, counters, n, k, k, 0, 0, WORLD=2, grid=(1,),
                                                **meta)
    registers, listing = sass(kernel.asm["ptx"])
    print(f"push_linear, {n} x {k} bf16, {meta}: {registers}")
    for line in listing.splitlines():
        if any(op in line for op in ORDERING):
            print("  " + " ".join(line.split()))


if __name__ == "__main__":
    main()
