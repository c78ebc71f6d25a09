"""The per-op decode GEMVs with their weight tiles copied to shared memory STAGES - 1 tiles ahead (cp.async,
Triton's software pipeline: GemvConfig.num_stages), walked in the whole graphed step on this GPU.

A one-stage loop holds one tile a thread in flight, so a kernel whose programs all fit at once has its rows'
tile bytes in flight and no more (7B FP8 wo in 1,024-wide tiles: 4 MB, which the H200's copy bandwidth moves in
about 1 us). Stages raise the bytes in flight without registers. Needs tried.diff applied (the kernels take
the stages); it lost everywhere it ran (tried.diff's header). For each GEMV, in
step_launches.ORDER, this tries the model's launch at 2 and 3 stages and with its tile twice and half as wide
(candidates), keeps a launch only where the step runs faster by more than the noise, then times the model's
launches and the chosen ones in turn, three times each. Block formats are tuned on first use first, as every
command does. Random weights; from the repository root, on one GPU:

    python scripts/experiments/gemv_stages/stages.py --shape llama-2-7b --weights fp8_e5m2 q4_0 bf16
"""
import argparse
import dataclasses
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from step_launches import NOISE, confirm, jobs, put, timed  # noqa: E402

from llamafast.config import Backend, DType, FP8Format, WeightFormat  # noqa: E402
from llamafast.kernels._common import next_pow2  # noqa: E402
from llamafast.kernels.gemv import GemvConfig  # noqa: E402
from llamafast.load import random_model  # noqa: E402
from llamafast.load.build import random_block_models  # noqa: E402
from llamafast.runtime import tune  # noqa: E402


def model_for(shape: str, weights: str):
    if weights in ("bf16",) or weights.startswith("fp8_"):
        fp8 = FP8Format(weights.removeprefix("fp8_")) if weights != "bf16" else None
        return random_model(shape, torch.device("cuda"), DType.bfloat16, Backend.triton, fp8=fp8).model
    return random_block_models(shape, torch.device("cuda"), DType.bfloat16, Backend.triton,
                               [WeightFormat(weights)])[0].model


def default_launch(key: tuple) -> GemvConfig:
    """gemv.gemv_config's default for a key no table holds."""
    n, k = key[:2]
    block_k = min(1024, next_pow2(k))
    return GemvConfig(8, block_k, 4) if n >= 8192 else GemvConfig(2, block_k, 1)


def candidates(launch: GemvConfig, pair: bool, k: int) -> list[GemvConfig]:
    """The launch at 2 and 3 stages, its tile twice as wide at 2 and 3 and half as wide at 3 and 4, within 64
    fp32 accumulators a thread and with at least two tiles along K (a pipeline needs a next tile)."""
    out = [dataclasses.replace(launch, num_stages=s) for s in (2, 3)]
    for bk, stages in ((launch.block_k * 2, (2, 3)), (launch.block_k // 2, (3, 4))):
        per_thread = launch.block_n * bk * (2 if pair else 1) / (32 * launch.num_warps)
        if 32 <= bk and bk * 2 <= next_pow2(k) and 8 <= per_thread <= 64:
            out += [dataclasses.replace(launch, block_k=bk, num_stages=s) for s in stages]
    return out


def walk(model, steps: int, budget_s: float, make=None) -> dict:
    """Each GEMV's candidates (make(launch, pair, k), default candidates) in the whole step, one kernel at a time;
    {(table, key): launch} kept."""
    make = make or candidates
    tables, chosen = model.backend.launches, {}
    best = timed(model, steps, "the model's launches")
    t0 = time.perf_counter()
    for table, key, _ in jobs(model):
        start = tables[table].get(key)
        current = start
        for launch in make(start or default_launch(key), table == "rmsnorm_swiglu", key[1]):
            if time.perf_counter() - t0 > budget_s:
                print(f"  budget of {budget_s:.0f} s spent: the walk stops here", flush=True)
                return chosen
            put(tables, table, key, launch)
            ms = timed(model, steps, f"{table} {key}: {launch.block_n}x{launch.block_k}, {launch.num_warps} warps, "
                                     f"{launch.num_stages} stages")
            if ms < best * (1 - NOISE):
                best, current, chosen[(table, key)] = ms, launch, launch
        put(tables, table, key, current)
    return chosen


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="llama-2-7b")
    p.add_argument("--weights", nargs="+", default=["fp8_e5m2", "q4_0", "bf16"])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--budget", type=float, default=150, help="seconds of walking per weight format")
    a = p.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    for weights in a.weights:
        t0 = time.perf_counter()
        model = model_for(a.shape, weights)
        tuned = tune(model)
        print(f"{a.shape} {weights}: built and tuned in {time.perf_counter() - t0:.0f} s "
              f"({len(tuned.plan.missing) if tuned else 0} keys tuned)", flush=True)
        tables = model.backend.launches
        before = {(t, k): tables[t].get(k) for t, k, _ in jobs(model)}
        for (t, k), launch in before.items():
            print(f"  start: {t} {k}: {launch}", flush=True)
        chosen = walk(model, a.steps, a.budget)
        print(f"chosen: {chosen or 'the launches it had'}", flush=True)
        if chosen:
            confirm(model, chosen, {tk: before[tk] for tk in chosen}, a.steps, False)
        print(f"{weights}: {time.perf_counter() - t0:.0f} s", flush=True)
        del model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
