"""Sweeps the launch parameters of the decode kernels at a model shape on the GPU; prints the best per
kernel and writes every measurement as JSON. The winners go into each kernel's CONFIGS table, with a
comment that points at the committed output of this script.

    python scripts/tune_kernels.py --shape llama-2-7b --out scripts/results/tune_7b.json
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys

import torch

from llamafast.bench.common import copy_bandwidth, environment, input_sets, time_in_graph
from llamafast.config import model_config
from llamafast.bench.registry import REGISTRY, linear_residual, rmsnorm_lm_head, rmsnorm_qkv_rope
from llamafast.kernels import rmsnorm_swiglu
from llamafast.kernels.decode_attention import AttentionConfig
from llamafast.kernels.gemv import GemvConfig
from llamafast.quant import FP8Format

GEMV_MODULES = {
    "rmsnorm_qkv_rope": sys.modules[rmsnorm_qkv_rope.__module__],
    "linear_residual[wo]": sys.modules[linear_residual.__module__],
    "rmsnorm_swiglu": sys.modules[rmsnorm_swiglu.__module__],
    "linear_residual[w2]": sys.modules[linear_residual.__module__],
    "rmsnorm_lm_head": sys.modules[rmsnorm_lm_head.__module__],
}


def gemv_candidates(pair: bool, fp8: bool) -> list[GemvConfig]:
    out = []
    block_ks = [256, 512, 1024, 2048] if fp8 else [128, 256, 512, 1024]
    for bn, bk, w, st in itertools.product([2, 4, 8, 16, 32], block_ks, [1, 2, 4, 8], [1]):
        per_thread = bn * bk * (2 if pair else 1) / (32 * w)  # fp32 accumulators per thread
        if 8 <= per_thread <= 64 and bk * bn >= 8 * 32 * w:  # at least 8 elements per thread
            out.append(GemvConfig(bn, bk, w, st))
    return out


def shape_key(name: str, args: tuple) -> tuple[int, int, int]:
    w = args[2] if name != "linear_residual[wo]" and name != "linear_residual[w2]" else args[1]
    return (*w.shape, w.element_size())


def sweep_gemv(name, config, dtype, copy_bw, fp8):
    spec = REGISTRY[name]
    nbytes = spec.bytes_moved(config, dtype, 1, fp8)
    sets = input_sets(lambda: spec.make_inputs(config, dtype, torch.device("cuda"), 1, fp8), nbytes)
    key = shape_key(name, sets[0][0])
    rows = []
    for cfg in gemv_candidates(pair=name == "rmsnorm_swiglu", fp8=fp8 is not None):
        try:
            us = time_in_graph(functools.partial(spec.kernel, configs={key: cfg}), sets, replays=10)
        except Exception as e:  # a config the compiler rejects (too many registers, ...)
            print(f"  {name} {cfg}: {type(e).__name__}", file=sys.stderr)
            continue
        rows.append({"kernel": name, "shape": list(key), "config": cfg.__dict__, "us": us,
                     "gb_s": nbytes / us / 1e3, "fraction": nbytes / us / 1e3 / copy_bw})
    del sets
    torch.cuda.empty_cache()
    return rows


def sweep_attention(config, dtype, context, copy_bw):
    spec = REGISTRY["decode_attention"]
    nbytes = spec.bytes_moved(config, dtype, context)
    sets = input_sets(lambda: spec.make_inputs(config, dtype, torch.device("cuda"), context), nbytes)
    key = (config.n_kv_heads, config.n_heads // config.n_kv_heads)
    rows = []
    for splits, bs, w in itertools.product([4, 8, 16, 32], [32, 64, 128], [2, 4, 8]):
        cfg = AttentionConfig(splits, bs, w)
        us = time_in_graph(functools.partial(spec.kernel, configs={key: cfg}), sets, replays=10)
        rows.append({"kernel": "decode_attention", "context": context, "config": cfg.__dict__,
                     "us": us, "gb_s": nbytes / us / 1e3, "fraction": nbytes / us / 1e3 / copy_bw})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="llama-2-7b")
    parser.add_argument("--contexts", default="512,4096")
    parser.add_argument("--kernels", default=",".join(GEMV_MODULES) + ",decode_attention")
    parser.add_argument("--fp8", choices=[f.value for f in FP8Format], help="tune the FP8 weight variants")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    fp8 = FP8Format(args.fp8) if args.fp8 else None
    config, dtype, device = model_config(args.shape), torch.bfloat16, torch.device("cuda")
    copy_bw = copy_bandwidth(device)
    rows = []
    for name in args.kernels.split(","):
        if name == "decode_attention":
            for context in map(int, args.contexts.split(",")):
                rows += sweep_attention(config, dtype, context, copy_bw)
        else:
            rows += sweep_gemv(name, config, dtype, copy_bw, fp8)
    with open(args.out, "w") as f:
        json.dump({"shape": args.shape, "fp8": args.fp8, "copy_bw_gb_s": copy_bw, "environment": environment(device), "rows": rows},
                  f, indent=1)
    print(f"{args.shape} bf16 activations, {args.fp8 or 'bf16'} weights, copy bandwidth {copy_bw:.0f} GB/s")
    groups = itertools.groupby(sorted(rows, key=lambda r: (r["kernel"], r.get("context", 0))),
                               key=lambda r: (r["kernel"], r.get("context", 0)))
    for (kernel, context), group in groups:
        ranked = sorted(group, key=lambda r: r["us"])
        for r in ranked[:3]:
            print(f"{kernel:22} ctx {context:5} {r['us']:8.1f} us {r['gb_s']:6.0f} GB/s {100 * r['fraction']:5.1f}%  "
                  f"{r['config']}")


if __name__ == "__main__":
    main()
