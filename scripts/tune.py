"""The launch sweeps behind the kernels' committed launch tables, on one GPU: one subcommand per set of tables. Each
prints the winners and writes every measurement as JSON with the GPU and versions; the winners go into the kernels'
CONFIGS tables by hand, beside a comment that cites the committed output (docs/tuning.md lists the files).

    python scripts/tune.py decode --shape llama-2-7b [--fp8 e5m2] --out scripts/results/tune_7b.json
    python scripts/tune.py prefill --out scripts/results/tune_prefill.json
    python scripts/tune.py sparse --shape llama-2-7b --out scripts/results/sparse/tune_7b.json
    python scripts/tune.py sparse --shape llama-2-7b --variants router-q4_0,router-q8_0 --out OUT.json
    python scripts/tune.py tp --shape llama-2-7b --world 2 --out scripts/results/tp/tune_tp2_7b.json
    TRITON_CACHE_DIR=$(mktemp -d) python scripts/tune.py first-use --shape llama-2-7b --out OUT.json
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import sys
import tempfile
from pathlib import Path

import torch
from llamafast.kernels import sparse_select
from llamafast.kernels.gemv import GemvConfig, gemv_key
from llamafast.kernels.prefill.flash_attention import FlashConfig
from llamafast.kernels.prefill.tiles import TileConfig
from llamafast.kernels.sparse_ffn import DEFAULT

from llamafast import tuning
from llamafast.backends import build
from llamafast.bench.decode import bench_backend
from llamafast.bench.prefill import time_prefill
from llamafast.bench.prefill_registry import PREFILL
from llamafast.config import BLOCK_FORMATS, Backend, DType, SamplingConfig, WeightFormat, model_config
from llamafast.generate import Engine
from llamafast.load import random_model
from llamafast.measure.common import copy_bandwidth, environment, input_sets, random_prompt, time_in_graph
from llamafast.measure.registry import REGISTRY
from llamafast.quant import FP8Format
from llamafast.tuning.sweep import GEMV_KERNELS, TABLES, sweep

CUDA = torch.device("cuda")


def timed(fn, sets, replays: int = 20, **launch) -> float | None:
    """Microseconds per call of fn(..., **launch) in a CUDA graph; None for a launch the compiler rejects (registers,
    shared memory), which is reported on stderr."""
    try:
        return time_in_graph(functools.partial(fn, **launch), sets, replays=replays)
    except Exception as e:  # noqa: BLE001 (whatever the compiler raises)
        print(f"  {launch}: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
        return None


def gemv_grid(pair: bool, min_tile: bool) -> list[tuple[int, int, int]]:
    """(block_n, block_k, warps) with 8 to 64 fp32 accumulators per thread (pair: two weight tiles per step);
    min_tile: also at least 8 weights per thread per tile."""
    return [(bn, bk, w) for bn, bk, w in itertools.product([2, 4, 8, 16], [256, 512, 1024], [1, 2, 4, 8])
            if 8 <= bn * bk * (2 if pair else 1) / (32 * w) <= 64 and (not min_tile or bn * bk >= 8 * 32 * w)]


def write(path: str, report) -> None:
    with open(path, "w") as f:
        json.dump(report, f, indent=1)


# -- decode: the full grid at a model shape --------------------------------------------------------------------

def decode(a) -> None:
    """tuning/sweep.py's full grid per decode kernel at a shape (attention at --contexts), the 3 fastest printed."""
    fp8 = FP8Format(a.fp8) if a.fp8 else WeightFormat(a.weights) if a.weights else None
    config, copy_bw = model_config(a.shape), copy_bandwidth(CUDA)
    rows = []
    for name in a.kernels.split(","):
        for context in map(int, a.contexts.split(",")) if name == "decode_attention" else [None]:
            s = sweep(name, config, torch.bfloat16, CUDA, None if context else fp8, context or 1)
            for launch, error in s.failed.items():
                print(f"  {name} {launch}: {error}", file=sys.stderr)
            where = {"context": context} if context else {"shape": list(s.key)}
            rows += [{"kernel": name, **where, "config": launch.__dict__, "us": us, "gb_s": s.nbytes / us / 1e3,
                      "fraction": s.nbytes / us / 1e3 / copy_bw} for launch, us in s.times.items()]
    write(a.out, {"shape": a.shape, "fp8": a.fp8 or a.weights, "copy_bw_gb_s": copy_bw, "environment": environment(CUDA),
                  "rows": rows})
    print(f"{a.shape} bf16 activations, {a.fp8 or a.weights or 'bf16'} weights, copy bandwidth {copy_bw:.0f} GB/s")

    def by_kernel(r):
        return r["kernel"], r.get("context", 0)

    for (kernel, context), group in itertools.groupby(sorted(rows, key=by_kernel), key=by_kernel):
        for r in sorted(group, key=lambda r: r["us"])[:3]:
            print(f"{kernel:22} ctx {context:5} {r['us']:8.1f} us {r['gb_s']:6.0f} GB/s {100 * r['fraction']:5.1f}%  "
                  f"{r['config']}")


# -- prefill: tiles per prompt length, FlashAttention's blocks, the chunk size ----------------------------------

T = TileConfig
PREFILL_TILES = {
    "prefill_qkv_rope": [T(128, 256, 64, 8, 3), T(128, 256, 64, 8, 4), T(128, 128, 64, 8, 4), T(128, 64, 64, 4, 4),
                         T(64, 128, 64, 4, 4), T(64, 64, 64, 4, 4)],
    "prefill_swiglu": [T(128, 128, 64, 8, 4), T(128, 128, 64, 8, 3), T(64, 128, 64, 4, 3), T(128, 64, 64, 4, 4),
                       T(64, 128, 64, 4, 4)],
}
PREFILL_TILES["prefill_linear_residual[wo]"] = PREFILL_TILES["prefill_linear_residual[w2]"] = [
    T(128, 256, 64, 8, 3), T(128, 128, 64, 8, 4), T(128, 128, 128, 8, 3), T(128, 64, 64, 4, 4), T(64, 128, 64, 4, 4),
    T(64, 64, 64, 4, 4)]
FLASH_BLOCKS = [FlashConfig(64, 64, 4, 3), FlashConfig(128, 128, 8, 3), FlashConfig(128, 64, 8, 3)]
PREFILL_ROWS, FLASH_TOKENS, CHUNKS = [128, 512, 4000], 4096, [1024, 2048, 4096]


def prefill(a) -> None:
    """At Llama-2-7B shapes: every candidate tile of the prompt matmuls at 128, 512 and 4,000 rows, FlashAttention's
    blocks at 4,096 tokens, then time to first token at 4,000 tokens per prefill chunk on the committed tables."""
    config, rows = model_config("llama-2-7b"), []
    for name, candidates in PREFILL_TILES.items():
        spec = PREFILL[name]
        for m in PREFILL_ROWS:
            sets = [spec.make_inputs(config, torch.bfloat16, CUDA, m, 0, None) for _ in range(2)]
            flops, best = spec.flops(config, m, 0), None
            for tile in candidates:
                us = timed(spec.kernel, sets, configs={1 << 30: tile})  # one bound above every row count
                if us is not None:
                    rows.append({"kernel": name, "m": m, "config": dataclasses.asdict(tile), "us": us,
                                 "tflop_s": flops / us / 1e6})
                    best = min(best or (us, tile), (us, tile), key=lambda t: t[0])
            ref = time_in_graph(spec.reference, sets)
            print(f"{name:30s} M={m:5d} best {best[0]:8.1f} us {flops / best[0] / 1e6:6.1f} TFLOP/s {best[1]}; "
                  f"reference {ref:8.1f} us")
    spec = PREFILL["flash_attention"]
    sets = [spec.make_inputs(config, torch.bfloat16, CUDA, FLASH_TOKENS, 0, None)]
    for blocks in FLASH_BLOCKS:
        us = time_in_graph(functools.partial(spec.kernel, configs={config.head_dim: blocks}), sets)
        tflops = spec.flops(config, FLASH_TOKENS, 0) / us / 1e6
        rows.append({"kernel": "flash_attention", "m": FLASH_TOKENS, "config": dataclasses.asdict(blocks), "us": us,
                     "tflop_s": tflops})
        print(f"flash_attention M={FLASH_TOKENS} {blocks}: {us:8.1f} us {tflops:6.1f} TFLOP/s")
    # The chunk sweep runs the committed tables: the winners above reach the kernels only by hand.
    lm = random_model("llama-2-7b", CUDA, DType.bfloat16, Backend.triton)
    ids = random_prompt(4000, config.vocab_size, torch.Generator().manual_seed(0))
    for chunk in CHUNKS:
        engine = Engine(lm.model, SamplingConfig(temperature=0), 4001, prefill_chunk=chunk)
        torch.cuda.reset_peak_memory_stats()
        time_prefill(engine, ids, 1)
        times = sorted(time_prefill(engine, ids, 7))
        peak = torch.cuda.max_memory_allocated() / 1e9
        rows.append({"chunk": chunk, "ttft_ms_4000": times[3] * 1e3, "peak_gb": peak})
        print(f"chunk {chunk}: ttft at 4000 tokens {times[3] * 1e3:.2f} ms (min {times[0] * 1e3:.2f})")
        del engine
    if a.out:
        write(a.out, rows)


# -- sparse: the sparse FFN's gather, scatter and selection launches --------------------------------------------

def sparse(a) -> None:
    """The sparse FFN at half its groups skipped: its gather launches, then its scatter launches with the best
    gather, then the selection's GEMV; the dense FFN's two kernels timed beside it."""
    config, copy_bw = model_config(a.shape), copy_bandwidth(CUDA)
    rows, summary = [], []
    for variant in a.variants.split(","):
        mode, weights = variant.split("-")  # weights: bf16, fp8 (E5M2) or a block format (gate and up; W2t Q8_0)
        fp8 = None if weights == "bf16" else FP8Format.e5m2 if weights == "fp8" else WeightFormat(weights)
        r, s = _sparse_sweep(f"sparse_ffn[{mode} 0.5]", config, fp8, copy_bw)
        s["dense_ffn_us"] = sum(_graph_us(name, config, fp8) for name in ("rmsnorm_swiglu", "linear_residual[w2]"))
        rows += r
        summary.append(s)
        write(a.out, {"shape": a.shape, "copy_bw_gb_s": copy_bw, "environment": environment(CUDA),
                      "summary": summary, "rows": rows})  # after each variant: a timeout keeps what was measured
    print(f"{a.shape}, copy bandwidth {copy_bw:.0f} GB/s; best per variant:")
    for s in summary:
        print(f"  {s['kernel']:24} {s['fp8'] or 'bf16':5} {s['us']:6.1f} us {s['gb_s']:5.0f} GB/s "
              f"{100 * s['fraction']:5.1f}% | dense FFN {s['dense_ffn_us']:5.1f} us | select "
              f"{s['select']['best']['us']:5.1f} us {s['select']['best']['config']} | {s['best']}")


def _registry_sets(name, config, fp8):
    spec = REGISTRY[name]
    nbytes = spec.bytes_moved(config, torch.bfloat16, 1, fp8)
    return spec, nbytes, input_sets(functools.partial(spec.make_inputs, config, torch.bfloat16, CUDA, 1, fp8), nbytes)


def _graph_us(name, config, fp8) -> float:
    spec, _, sets = _registry_sets(name, config, fp8)
    return time_in_graph(spec.kernel, sets, replays=30)


def _sparse_sweep(name, config, fp8, copy_bw):
    spec, nbytes, sets = _registry_sets(name, config, fp8)
    key = gemv_key(sets[0][0][2])  # w1's: the launch tables' key
    gather = [dataclasses.replace(DEFAULT, block_n=bn, block_k=bk, num_warps=w) for bn, bk, w in gemv_grid(True, False)]
    scatter = [(splits, bc, w) for splits, bc, w in itertools.product([8, 16, 32, 64], [32, 64, 128, 256, 512],
                                                                      [1, 2, 4, 8])
               if 8 <= 32 * bc / (32 * w) <= 128]  # a (G = 32, BLOCK_C) tile per step
    rows, best = [], DEFAULT
    for stage in ("gather", "scatter"):  # the scatter's candidates keep the best gather launch
        candidates = gather if stage == "gather" else [
            dataclasses.replace(best, splits=splits, block_c=bc, scatter_warps=w) for splits, bc, w in scatter]
        results = []
        for cfg in candidates:
            us = timed(spec.kernel, sets, replays=10, configs={key: cfg})
            if us is not None:
                results.append((us, cfg))
                rows.append({"kernel": name, "fp8": fp8 and fp8.value, "stage": stage, "config": cfg.__dict__,
                             "us": us, "gb_s": nbytes / us / 1e3, "fraction": nbytes / us / 1e3 / copy_bw})
        best = min(results, key=lambda r: r[0])[1]
    us = time_in_graph(functools.partial(spec.kernel, configs={key: best}), sets, replays=30)
    summary = {"kernel": name, "fp8": fp8 and fp8.value, "best": best.__dict__, "us": us, "gb_s": nbytes / us / 1e3,
               "fraction": nbytes / us / 1e3 / copy_bw, "select": _select_sweep(sets, key, "router" in name)}
    del sets
    torch.cuda.empty_cache()
    return rows, summary


def _select_sweep(sets, key, router: bool) -> dict:
    """The selection kernel alone: the router GEMV's launches (gate mode: the W1 GEMV's), the best kept."""
    def select(*a, configs, **k):
        return sparse_select.select_groups(*a[:3], *a[5:12], configs=configs)

    shape = (*sets[0][0][5].shape, sets[0][0][5].element_size()) if router else key
    results = []
    for bn, bk, w in itertools.product([1, 2, 4] if router else [32, 64], [512, 1024, 2048, 4096], [2, 4, 8]):
        if router or bn >= sets[0][0][10]:  # gate mode: whole groups per program
            us = timed(select, sets, replays=10, configs={shape: GemvConfig(bn, bk, w)})
            if us is not None:
                results.append({"config": [bn, bk, w], "us": us})
    return {"shape": list(shape), "best": min(results, key=lambda r: r["us"]), "all": results}


# -- tp: a tensor-parallel rank's shard shapes -------------------------------------------------------------------

def tp(a) -> None:
    """Rank 0's shard of a tensor-parallel model on this one GPU: its decode step without communication (the floor
    its launches set, as profile_tp.py times it), then each decode GEMV's launches at the shard's shapes."""
    from llamafast.kernels import linear_residual, rmsnorm_lm_head, rmsnorm_qkv_rope, rmsnorm_swiglu
    from profile_tp import one_gpu_steps  # scripts/, this file's folder, is on sys.path

    model, steps = one_gpu_steps(a.shape, a.world, CUDA)
    copy_bw, layer, c, dt = copy_bandwidth(CUDA), model.layers[0], model.config.dim, torch.bfloat16
    cache = layer.k_cache

    def vec(n):
        return torch.randn(1, n, device=CUDA, dtype=dt)

    def norm():
        return torch.ones(c, device=CUDA, dtype=dt)

    def residual(w):
        return (vec(w.shape[1]), w, vec(c)), {}

    def qkv(w):
        pos, k, v = torch.tensor(3, device=CUDA), torch.zeros_like(cache), torch.zeros_like(cache)
        return (vec(c), norm(), w, model.rope_cos, model.rope_sin, pos, k, v, 1e-5), {}

    jobs = {  # kernel, its weight in rank 0's shard, that weight -> (args, kwargs)
        "rmsnorm_qkv_rope": (rmsnorm_qkv_rope, layer.attention.wqkv.weight, qkv),
        "linear_residual[wo]": (linear_residual, layer.attention.wo.weight, residual),
        "rmsnorm_swiglu": (rmsnorm_swiglu, layer.feed_forward.w1.weight,
                           lambda w: ((vec(c), norm(), w, torch.randn_like(w), 1e-5), {})),
        "linear_residual[w2]": (linear_residual, layer.feed_forward.w2.weight, residual),
        "rmsnorm_lm_head": (rmsnorm_lm_head, model.output.weight, lambda w: ((vec(c), norm(), w, 1e-5), {})),
    }
    rows = []
    for name, (fn, w, make) in jobs.items():
        pair = name == "rmsnorm_swiglu"
        nbytes = w.nbytes * (2 if pair else 1)
        sets = input_sets(lambda: make(torch.randn_like(w)), nbytes)  # noqa: B023 (used in this iteration)
        key = (*w.shape, w.element_size())
        for bn, bk, warps in gemv_grid(pair, True):
            us = timed(fn, sets, replays=10, configs={key: GemvConfig(bn, bk, warps)})
            if us is not None:
                rows.append({"kernel": name, "shape": list(key), "config": GemvConfig(bn, bk, warps).__dict__, "us": us,
                             "fraction": nbytes / us / 1e3 / copy_bw})
        del sets
        torch.cuda.empty_cache()
    for kernel, group in itertools.groupby(rows, key=lambda r: r["kernel"]):
        for r in sorted(group, key=lambda r: r["us"])[:2]:
            print(f"{kernel:22} {r['shape']} {r['us']:7.1f} us {100 * r['fraction']:5.1f}%  {r['config']}")
    write(a.out, {"shape": a.shape, "world": a.world, "copy_bw_gb_s": copy_bw, "one_gpu": True,
                  "environment": environment(CUDA), "steps": steps, "tune": rows})


# -- first-use: tuning on first use against its aims --------------------------------------------------------------

def first_use(a) -> None:
    """Tuning on first use from scratch (its aim: at most 60 s at 7B, from an empty Triton cache), then decode with
    the committed and with the just-tuned launches, alternately (its aim: no slower)."""
    fp8 = FP8Format(a.fp8) if a.fp8 else None
    lm = random_model(a.shape, CUDA, DType.bfloat16, Backend.triton, fp8=fp8)
    plan = tuning.prepare(lm.model, folder=Path(tempfile.mkdtemp()), ignore_committed=True)
    if plan is None:
        sys.exit("tuning is off (LLAMAFAST_TUNE=0)")
    done = tuning.tune(plan)
    print(f"{a.shape}, {a.fp8 or 'bf16'} weights, on {plan.gpu}: tuned {len(done.launches)} launches from "
          f"scratch in {done.seconds:.1f} s")
    launches = []
    for (table, key), entry in sorted(done.launches.items()):
        committed = TABLES[table].get(key)
        launches.append({"table": table, "key": list(key), "tuned": entry.launch.__dict__, "us": entry.us,
                         "committed": committed and committed.__dict__})
        print(f"  {table:18} {key!s:18} tuned {entry.launch} ({entry.us:.1f} us); committed {committed}")
    prompt = random_prompt(a.prompt_len, lm.model.config.vocab_size, torch.Generator().manual_seed(0))
    m = lm.model  # on the committed tables (from-scratch tuning leaves them alone); its twin on the tuned ones
    twin = dataclasses.replace(lm, model=build(m.config, m.state_dict(), Backend.triton, *m.weight_formats))
    tuning.override(twin.model, done.launches)
    runs = []
    for _ in range(a.rounds):
        for tables, model in (("committed", lm), ("tuned", twin)):
            r = bench_backend(model, Backend.triton, prompt, a.new_tokens)
            runs.append({"tables": tables, "decode_tokens_per_s": r.decode_tokens_per_s,
                         "decode_ms_per_token": r.decode_ms_per_token})
            print(f"  decode with the {tables:9} tables: {r.decode_tokens_per_s:7.1f} tok/s "
                  f"({r.decode_ms_per_token:.3f} ms/token)")
    write(a.out, {"shape": a.shape, "fp8": a.fp8, "environment": environment(CUDA), "tune_s": done.seconds,
                  "launches": launches, "runs": runs})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    commands = {}
    for name, run, summary in (("decode", decode, "the decode kernels' full launch grid at a model shape"),
                               ("prefill", prefill, "the prompt kernels' tiles and the prefill chunk, at 7B"),
                               ("sparse", sparse, "the sparse FFN's gather, scatter and selection launches"),
                               ("tp", tp, "the decode GEMVs at a tensor-parallel rank's shard shapes, on one GPU"),
                               ("first-use", first_use, "tuning on first use against its aims")):
        cmd = commands[name] = sub.add_parser(name, help=summary, description=" ".join(run.__doc__.split()))
        cmd.set_defaults(run=run)
        if name != "prefill":
            cmd.add_argument("--shape", default="llama-2-7b")
        cmd.add_argument("--out", required=name != "prefill", help="the JSON report")
    for name in ("decode", "first-use"):
        commands[name].add_argument("--fp8", choices=[f.value for f in FP8Format], help="FP8 weights of this format")
    commands["decode"].add_argument("--contexts", default="512,4096", help="attention's positions")
    commands["decode"].add_argument("--weights", choices=list(BLOCK_FORMATS), help="block weights (no --fp8)")
    commands["decode"].add_argument("--kernels", default=",".join(GEMV_KERNELS) + ",decode_attention")
    commands["sparse"].add_argument("--variants", default="router-bf16,router-fp8,gate-bf16,gate-fp8",
                                    help="MODE-WEIGHTS pairs; WEIGHTS bf16, fp8 (E5M2) or a block format (q4_0, ...)")
    commands["tp"].add_argument("--world", type=int, default=2, help="the tensor-parallel size whose rank 0 is tuned")
    commands["first-use"].add_argument("--prompt-len", type=int, default=16)
    commands["first-use"].add_argument("--new-tokens", type=int, default=256)
    commands["first-use"].add_argument("--rounds", type=int, default=2, help="decode runs per table, alternating")
    args = parser.parse_args()
    args.run(args)

if __name__ == "__main__":
    main()
