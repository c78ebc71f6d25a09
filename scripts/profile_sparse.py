"""Per-kernel GPU time of the sparse FFN (select, gather, scatter, reduce) and of the dense FFN kernels at a model
shape, half the groups skipped, from torch.profiler's CUDA activity (kernel durations, no launch gaps).

    python scripts/profile_sparse.py --shape llama-2-7b --out scripts/results/sparse/profile_7b.json
"""

from __future__ import annotations

import argparse
import collections
import json

import torch
from torch.profiler import ProfilerActivity, profile

from llamafast.measure.common import input_sets
from llamafast.measure.registry import REGISTRY
from llamafast.config import model_config
from llamafast.quant import FP8Format

CALLS = 20


def kernel_us(fn, sets, **kw) -> dict[str, float]:
    for args, kwargs in sets:
        fn(*args, **kwargs, **kw)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(CALLS):
            args, kwargs = sets[i % len(sets)]
            fn(*args, **kwargs, **kw)
        torch.cuda.synchronize()
    totals = collections.defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            totals[e.name] += e.device_time / CALLS  # device_time is microseconds
    return dict(totals)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="llama-2-7b")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    config, dtype, device = model_config(a.shape), torch.bfloat16, torch.device("cuda")
    report = []
    for fp8 in (None, FP8Format.e5m2):
        for name in ("sparse_ffn[router 0.5]", "sparse_ffn[gate 0.5]", "rmsnorm_swiglu", "linear_residual[w2]"):
            spec = REGISTRY[name]
            nbytes = spec.bytes_moved(config, dtype, 1, fp8)
            sets = input_sets(lambda: spec.make_inputs(config, dtype, device, 1, fp8), nbytes)
            times = kernel_us(spec.kernel, sets)
            report.append({"kernel": name, "fp8": fp8 and fp8.value, "kernels_us": times,
                           "total_us": sum(times.values()), "bytes": nbytes})
            del sets
            torch.cuda.empty_cache()
    with open(a.out, "w") as f:
        json.dump({"shape": a.shape, "calls": CALLS, "report": report}, f, indent=1)
    for r in report:
        parts = ", ".join(f"{k.split('(')[0][:28]} {v:.1f}" for k, v in r["kernels_us"].items())
        print(f"{r['kernel']:24} {r['fp8'] or 'bf16':5} {r['total_us']:6.1f} us "
              f"{r['bytes'] / r['total_us'] / 1e3:5.0f} GB/s | {parts}")


if __name__ == "__main__":
    main()
