"""What one loop step of the block GEMVs issues, in the SASS: each 7B block GEMV compiled for sm_90a on a machine
without a GPU (step_spills.py's stand-in driver) with the launch that tuning on first use picked on one H200
(scripts/results/quant/tuned_7b_blocks_h200_c7ff84c.json), from the kernel registry's inputs at Llama-2-7B's
shape (the int8 activations' pass is compiled, not counted); per thread, the weights a loop step multiplies and
the loop body's instructions by kind (the GEMVs that tuning ran in that format: Q6_K the LM head of Q4_K's
layers, Q8_0 that of Q4_0's). Nothing is launched. From the repository root, with the project importable:

    python scripts/experiments/block_sass/block_loops.py [q8_0 q4_0 q4_k ...]
"""
import collections
import json
import os
import re
import sys
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "fp8_layout")]

import torch  # noqa: E402
from llamafast.kernels.gemv import GemvConfig  # noqa: E402
from loop_sass import loop_bodies  # noqa: E402
from push_sass import sass  # noqa: E402
from step_spills import H100  # noqa: E402
from triton.runtime import driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from llamafast.config import MODEL_CONFIGS, WeightFormat  # noqa: E402
from llamafast.measure.registry import REGISTRY  # noqa: E402

TUNED = HERE.parents[1] / "results" / "quant" / "tuned_7b_blocks_h200_c7ff84c.json"
# registry entry, its launch table and how many weight rows one output row reads (SwiGLU: w1 and w3)
GEMVS = (("rmsnorm_qkv_rope", "rmsnorm_qkv_rope", 1), ("linear_residual[wo]", "linear_residual", 1),
         ("rmsnorm_swiglu", "rmsnorm_swiglu", 2), ("linear_residual[w2]", "linear_residual", 1),
         ("rmsnorm_lm_head", "rmsnorm_lm_head", 1))
KINDS = ("LDG", "LDS", "IDP", "IMAD", "IADD3", "LOP3", "SHF", "PRMT", "I2F", "F2F", "HADD2", "FFMA", "FMUL", "FADD",
         "MOV", "SEL", "ISETP", "BAR")


def compile_only(fn, *args, **kw):
    """fn's kernels compiled, not launched (JITFunction.run with warmup): {kernel name: compiled kernel}."""
    compiled, run = {}, JITFunction.run

    def warm(self, *a, grid, warmup, **k):
        kernel = run(self, *a, grid=grid, warmup=True, **k)
        compiled[self.fn.__name__] = kernel
        return kernel

    JITFunction.run = warm
    try:
        fn(*args, **kw)
    finally:
        JITFunction.run = run
    return compiled


def kinds(body: list[str]) -> dict[str, int]:
    counts = collections.Counter()
    for line in body:
        m = re.search(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
        if m:
            op = m.group(1)
            counts[next((k for k in KINDS if op.startswith(k)), op)] += 1
    return dict(counts.most_common())


def main(formats: list[str]) -> None:
    driver.set_active(H100())
    config = MODEL_CONFIGS["llama-2-7b"]
    entries = json.loads(TUNED.read_text())["launches"]
    tuned = {(e["table"], tuple(e["key"])): GemvConfig(**e["launch"]) for e in entries}
    for fmt in formats:
        for name, table, pair in GEMVS:
            spec = REGISTRY[name]
            args, kw = spec.make_inputs(config, torch.bfloat16, torch.device("cpu"), 1, WeightFormat(fmt))
            w = next(a for a in args if hasattr(a, "fmt"))
            key = (w.shape[0], w.shape[1], fmt)
            cfg = tuned.get((table, key))
            if cfg is None:  # a format the bench ran at other GEMVs only (Q6_K: the LM head of Q4_K's layers)
                continue
            kernels = compile_only(spec.kernel, *args, **kw, configs={key: cfg})
            main_kernel = next(k for n, k in kernels.items() if "quantize" not in n)
            registers, listing = sass(main_kernel.asm["ptx"])
            bodies = loop_bodies(listing)
            per_thread = cfg.block_n * cfg.block_k * pair // (32 * cfg.num_warps)
            print(f"{fmt} {name} {key[:2]} {cfg.block_n}x{cfg.block_k}/{cfg.num_warps} warps"
                  f"{' own int8' if cfg.own_int8 else ''}: {registers.split(':')[-1].strip()}; {per_thread} weights "
                  f"a thread a step")
            for body in bodies:
                print(f"  loop: {len(body)} instructions, {len(body) / per_thread:.2f} a weight; {kinds(body)}")


if __name__ == "__main__":
    main(sys.argv[1:] or ["q8_0", "q4_0", "q4_k"])
