"""Whether a Triton kernel's cache key depends on what the process computed before it: `_linear_residual_kernel`'s
key in a fresh interpreter, then in one that computed `_rmsnorm_swiglu_kernel`'s first (both compile linear
residual's tile helpers). Triton 3.6 folds a callee's global constants into its caller's key only where the
callee's key is already computed, so on a tree without kernels/_common.settle_cache_keys the two differ and a
process that launched the kernels in the other order misses their disk cache. No GPU needed; from the repository
root, with the project importable:

    python scripts/experiments/compile_ahead/key_order.py
"""
import os
import subprocess
import sys

PROBE = """
import importlib, sys
first = sys.argv[1]
if first != "none":
    importlib.import_module("llamafast.kernels.rmsnorm_swiglu")._rmsnorm_swiglu_kernel.cache_key
print(importlib.import_module("llamafast.kernels.linear_residual")._linear_residual_kernel.cache_key)
"""


def key(first: str) -> str:
    # the compiled functions, not the interpreter's
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", PROBE, first], env=env, capture_output=True, text=True, check=True)
    return out.stdout.split()[-1]


if __name__ == "__main__":
    alone, after = key("none"), key("swiglu")
    print(f"_linear_residual_kernel's key alone: {alone}")
    print(f"after _rmsnorm_swiglu_kernel's:      {after}")
    print("the same" if alone == after else "they differ")
