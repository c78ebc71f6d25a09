"""Sweeps the sparse FFN's launch parameters at a model shape with half the groups skipped, bf16 and FP8 E5M2
weights: the gather and scatter kernels (kernels/sparse_ffn.py SparseConfig) and the router's GEMV
(kernels/sparse_select.py); times the selection alone and the dense FFN kernels beside them. Prints the winners and writes every measurement as JSON; winners go into the CONFIGS tables.

    python scripts/tune_sparse.py --shape llama-2-7b --out scripts/results/sparse/tune_7b.json
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import sys

import torch
from llamafast.kernels import sparse_select
from llamafast.kernels.gemv import GemvConfig
from llamafast.kernels.sparse_ffn import DEFAULT, SparseConfig

from llamafast.measure.common import copy_bandwidth, environment, input_sets, time_in_graph
from llamafast.measure.registry import REGISTRY
from llamafast.config import model_config
from llamafast.quant import FP8Format


def gather_candidates(base: SparseConfig) -> list[SparseConfig]:
    out = []
    for bn, bk, w in itertools.product([2, 4, 8, 16], [256, 512, 1024], [1, 2, 4, 8]):
        if 8 <= 2 * bn * bk / (32 * w) <= 64:
            out.append(dataclasses.replace(base, block_n=bn, block_k=bk, num_warps=w))
    return out


def scatter_candidates(base: SparseConfig) -> list[SparseConfig]:
    out = []
    for splits, bc, w in itertools.product([8, 16, 32, 64], [32, 64, 128, 256, 512], [1, 2, 4, 8]):
        if 8 <= 32 * bc / (32 * w) <= 128:  # a (G = 32, BLOCK_C) tile per step
            out.append(dataclasses.replace(base, splits=splits, block_c=bc, scatter_warps=w))
    return out


def timed(fn, sets, **kw) -> float | None:
    try:
        return time_in_graph(functools.partial(fn, **kw), sets, replays=10)
    except Exception as e:  # a config the compiler rejects
        print(f"  {kw}: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
        return None


def sweep(name, config, dtype, fp8, copy_bw):
    spec = REGISTRY[name]
    nbytes = spec.bytes_moved(config, dtype, 1, fp8)
    sets = input_sets(lambda: spec.make_inputs(config, dtype, torch.device("cuda"), 1, fp8), nbytes)
    w1 = sets[0][0][2]
    key = (*w1.shape, w1.element_size())
    rows, best = [], DEFAULT
    for stage, make in (("gather", gather_candidates), ("scatter", scatter_candidates)):
        results = []
        for cfg in make(best):
            us = timed(spec.kernel, sets, configs={key: cfg})
            if us is not None:
                results.append((us, cfg))
                rows.append({"kernel": name, "fp8": fp8 and fp8.value, "stage": stage, "config": cfg.__dict__,
                             "us": us, "gb_s": nbytes / us / 1e3, "fraction": nbytes / us / 1e3 / copy_bw})
        best = min(results, key=lambda r: r[0])[1]
    us = time_in_graph(functools.partial(spec.kernel, configs={key: best}), sets, replays=30)
    select = _sweep_select(sets, key, "router" in name)
    summary = {"kernel": name, "fp8": fp8 and fp8.value, "best": best.__dict__, "us": us, "gb_s": nbytes / us / 1e3,
               "fraction": nbytes / us / 1e3 / copy_bw, "select": select}
    del sets
    torch.cuda.empty_cache()
    return rows, summary


def _sweep_select(sets, key, router: bool) -> dict:
    """The selection kernel alone: the router GEMV's launch swept (gate mode: the W1 GEMV's), the best kept."""
    def select(*a, **k):
        return sparse_select.select_groups(*a[:3], *a[5:12], w1_scale=k["w1_scale"], fmt=k["fmt"])

    shape = (*sets[0][0][5].shape, sets[0][0][5].element_size()) if router else key
    results = []
    for bn, bk, w in itertools.product([1, 2, 4] if router else [32, 64], [512, 1024, 2048, 4096], [2, 4, 8]):
        if router or bn >= sets[0][0][10]:
            sparse_select.CONFIGS[shape] = GemvConfig(bn, bk, w)
            us = timed(select, sets)
            if us is not None:
                results.append({"config": [bn, bk, w], "us": us})
    sparse_select.CONFIGS.pop(shape, None)
    return {"shape": list(shape), "best": min(results, key=lambda r: r["us"]), "all": results}


def dense_ffn_us(config, dtype, fp8) -> float:
    total = 0.0
    for name in ("rmsnorm_swiglu", "linear_residual[w2]"):
        spec = REGISTRY[name]
        nbytes = spec.bytes_moved(config, dtype, 1, fp8)
        sets = input_sets(lambda: spec.make_inputs(config, dtype, torch.device("cuda"), 1, fp8), nbytes)
        total += time_in_graph(spec.kernel, sets, replays=30)
    return total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="llama-2-7b")
    ap.add_argument("--out", required=True)
    ap.add_argument("--variants", default="router-bf16,router-fp8,gate-bf16,gate-fp8", help="which to sweep")
    a = ap.parse_args()
    config, dtype = model_config(a.shape), torch.bfloat16
    copy_bw = copy_bandwidth(torch.device("cuda"))
    rows, summary = [], []
    for variant in a.variants.split(","):
        mode, weights = variant.split("-")
        name, fp8 = f"sparse_ffn[{mode} 0.5]", None if weights == "bf16" else FP8Format.e5m2
        r, s = sweep(name, config, dtype, fp8, copy_bw)
        s["dense_ffn_us"] = dense_ffn_us(config, dtype, fp8)
        rows += r
        summary.append(s)
        with open(a.out, "w") as f:  # after each variant: a timeout keeps what was measured
            json.dump({"shape": a.shape, "copy_bw_gb_s": copy_bw, "environment": environment(torch.device("cuda")),
                       "summary": summary, "rows": rows}, f, indent=1)
    print(f"{a.shape}, copy bandwidth {copy_bw:.0f} GB/s; best per variant:")
    for s in summary:
        print(f"  {s['kernel']:24} {s['fp8'] or 'bf16':5} {s['us']:6.1f} us {s['gb_s']:5.0f} GB/s "
              f"{100 * s['fraction']:5.1f}% | dense FFN {s['dense_ffn_us']:5.1f} us | select "
              f"{s['select']['best']['us']:5.1f} us "
              f"{s['select']['best']['config']} | {s['best']}")


if __name__ == "__main__":
    main()
