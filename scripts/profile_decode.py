"""Where a decode step's time goes in the sparse FFN, kernel by kernel. It stays because docs/sparse-ffn.md's kernel
split comes from it (a tensor-parallel step's: scripts/profile_tp.py).

    python scripts/profile_decode.py sparse --shape llama-2-7b --out scripts/results/sparse/profile_7b.json

sparse: each CUDA kernel's time in the sparse FFN (select, gather, scatter) at half the groups skipped and in the
dense FFN's two kernels, bf16 and FP8 E5M2 weights, from torch.profiler (kernel durations, no launch gaps).
"""

from __future__ import annotations

import argparse
import collections
import functools
import json

import torch
from torch.profiler import ProfilerActivity, profile

from llamafast.measure.registry import REGISTRY
from llamafast.config import model_config
from llamafast.measure.common import input_sets
from llamafast.quant import FP8Format

CALLS = 20  # sparse: profiled calls per kernel set, cycling through the input sets


def kernel_us(fn, sets) -> dict[str, float]:
    """Microseconds per call of each CUDA kernel fn launches, over CALLS calls after one warm-up pass."""
    for args, kwargs in sets:
        fn(*args, **kwargs)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(CALLS):
            args, kwargs = sets[i % len(sets)]
            fn(*args, **kwargs)
        torch.cuda.synchronize()
    totals = collections.defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            totals[e.name] += e.device_time / CALLS  # device_time is microseconds
    return dict(totals)


def sparse(a) -> None:
    config, dtype, device = model_config(a.shape), torch.bfloat16, torch.device("cuda")
    report = []
    for fp8 in (None, FP8Format.e5m2):
        for name in ("sparse_ffn[router 0.5]", "sparse_ffn[gate 0.5]", "rmsnorm_swiglu", "linear_residual[w2]"):
            spec = REGISTRY[name]
            nbytes = spec.bytes_moved(config, dtype, 1, fp8)
            sets = input_sets(functools.partial(spec.make_inputs, config, dtype, device, 1, fp8), nbytes)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, run, summary in (("sparse", sparse, "the sparse and dense FFN kernel by kernel"),):
        cmd = sub.add_parser(name, help=summary)
        cmd.set_defaults(run=run)
        cmd.add_argument("--shape", default="llama-2-7b")
        cmd.add_argument("--out", required=True, help="the JSON report")
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
