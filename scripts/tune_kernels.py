"""Sweeps the launch parameters of the decode kernels at a model shape on the GPU (the full grid of
llamafast/tuning/sweep.py); prints the best per kernel and writes every measurement as JSON. The winners go into
each kernel's CONFIGS table, with a comment that points at the committed output of this script.

    python scripts/tune_kernels.py --shape llama-2-7b --out scripts/results/tune_7b.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys

import torch

from llamafast.measure.common import copy_bandwidth, environment
from llamafast.config import model_config
from llamafast.quant import FP8Format
from llamafast.tuning.sweep import GEMV_KERNELS, sweep


def rows(name, config, dtype, copy_bw, fp8=None, context=None) -> list[dict]:
    """Every launch's timing for one kernel (attention at `context` positions), as the results files hold them."""
    s = sweep(name, config, dtype, torch.device("cuda"), fp8, context or 1)
    for launch, error in s.failed.items():
        print(f"  {name} {launch}: {error}", file=sys.stderr)
    where = {"context": context} if context else {"shape": list(s.key)}
    return [{"kernel": name, **where, "config": launch.__dict__, "us": us, "gb_s": s.nbytes / us / 1e3,
             "fraction": s.nbytes / us / 1e3 / copy_bw} for launch, us in s.times.items()]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="llama-2-7b")
    parser.add_argument("--contexts", default="512,4096")
    parser.add_argument("--kernels", default=",".join(GEMV_KERNELS) + ",decode_attention")
    parser.add_argument("--fp8", choices=[f.value for f in FP8Format], help="tune the FP8 weight variants")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    fp8 = FP8Format(args.fp8) if args.fp8 else None
    config, dtype, device = model_config(args.shape), torch.bfloat16, torch.device("cuda")
    copy_bw = copy_bandwidth(device)
    out = []
    for name in args.kernels.split(","):
        if name == "decode_attention":
            for context in map(int, args.contexts.split(",")):
                out += rows(name, config, dtype, copy_bw, context=context)
        else:
            out += rows(name, config, dtype, copy_bw, fp8)
    with open(args.out, "w") as f:
        json.dump({"shape": args.shape, "fp8": args.fp8, "copy_bw_gb_s": copy_bw, "environment": environment(device), "rows": out},
                  f, indent=1)
    print(f"{args.shape} bf16 activations, {args.fp8 or 'bf16'} weights, copy bandwidth {copy_bw:.0f} GB/s")
    groups = itertools.groupby(sorted(out, key=lambda r: (r["kernel"], r.get("context", 0))),
                               key=lambda r: (r["kernel"], r.get("context", 0)))
    for (kernel, context), group in groups:
        ranked = sorted(group, key=lambda r: r["us"])
        for r in ranked[:3]:
            print(f"{kernel:22} ctx {context:5} {r['us']:8.1f} us {r['gb_s']:6.0f} GB/s {100 * r['fraction']:5.1f}%  "
                  f"{r['config']}")


if __name__ == "__main__":
    main()
