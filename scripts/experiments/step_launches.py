"""The per-op decode graph's GEMV launches chosen by the whole step on this GPU, not by each kernel timed alone.

The committed 7B launches won sweeps of each kernel alone on an H100 (scripts/results/tune_7b*.txt). Under
programmatic dependent launch a kernel's launch also sets how it overlaps its neighbours, and a faster memory
shifts the balance between a tile's bytes and its fixed costs, so this walks each GEMV's launches one kernel at a
time, a pass per grid (quick: the launches that won some Llama 2 sweep; full: tuning.sweep.gemv_candidates' whole
grid), keeping a launch only where the whole graphed step (profile_tp.timed_step) runs faster by more than the
noise. Then the committed and the chosen tables are timed in turn, three times each. --pdl: FP8 GEMVs under
programmatic dependent launch too (gemv.use_pdl leaves them without), in the descent, and the chosen tables under
it beside the committed ones without it. --ab: no descent; the tables a model on this GPU reads (kernels.ON_GPU's
entries over the committed ones) against the committed ones alone, in turn, three times each. --world N: rank 0's
shard of an N-way tensor-parallel split with no communication (profile_tp.floor_model, bf16), whose time is the
floor that tensor parallel's sync points add to. Block formats (q8_0, q4_0, q4_k, ...): the model is tuned on first
use, then walked from those launches, each candidate in each of its ways (the sweep's: after a quantize pass,
rounding its own int8, and on float activations where tuning offers it). Random weights; from the repository root,
on one GPU:

    python scripts/experiments/step_launches.py --shape llama-2-7b --weights bf16 fp8_e5m2 [--grids full quick]
    python scripts/experiments/step_launches.py --shape llama-2-7b --weights bf16 fp8_e5m2 fp8_e4m3 --ab
    python scripts/experiments/step_launches.py --shape llama-2-13b --weights bf16 --world 2
    python scripts/experiments/step_launches.py --shape llama-2-7b --weights q8_0 --grids quick full
"""
import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from profile_tp import floor_model, timed_step  # noqa: E402

from llamafast import tuning  # noqa: E402
from llamafast.backends import committed_launches  # noqa: E402
from llamafast.config import BLOCK_FORMATS, Backend, DType, FP8Format, WeightFormat  # noqa: E402
from llamafast.kernels import gemv  # noqa: E402
from llamafast.kernels._common import pdl_capable  # noqa: E402
from llamafast.load import random_block_models, random_model  # noqa: E402
from llamafast.tuning import model_jobs, ways  # noqa: E402
from llamafast.tuning.sweep import gemv_candidates, with_ways  # noqa: E402

NOISE = 0.002  # a launch is kept where the step gains more than 0.2%: repeated steps differ by about 0.1%


# The walk's order: the GEMVs that read the most bytes first.
ORDER = ["rmsnorm_swiglu", "linear_residual[w2]", "rmsnorm_qkv_rope", "linear_residual[wo]", "rmsnorm_lm_head"]


def jobs(model, quick: bool = True):
    """(table, key, candidates) per GEMV that tuning.model_jobs finds, in ORDER; FP8 and block weights take the
    1-byte list, as tuning's sweep gives them; quick: the quick list, else the full grid."""
    gemvs = sorted((j for j in model_jobs(model) if j.kernel in ORDER), key=lambda j: ORDER.index(j.kernel))
    return [(j.table, j.key, candidates(j, quick)) for j in gemvs]


def candidates(job, quick: bool) -> list:
    """One GEMV's launches; block weights': each in every way tuning's sweep times it (sweep.with_ways)."""
    return with_ways(gemv_candidates(job.kernel == "rmsnorm_swiglu", job.fp8 is not None, quick), job.fp8, job.key[1])


def label(table: str, key: tuple, launch) -> str:
    """How the log names a launch under trial (replay.py reads it back)."""
    way = f", {ways.way(launch)}" if isinstance(key[2], str) else ""
    return f"{table} {key}: {launch.block_n}x{launch.block_k}, {launch.num_warps} warps{way}"


def put(tables, table: str, key: tuple, launch) -> None:
    """The launch into the model's table (None: the kernel's default for the shape again)."""
    if launch is None:
        tables[table].pop(key, None)
    else:
        tables[table][key] = launch


def timed(model, steps: int, name: str) -> float:
    try:
        ms = timed_step(model, steps)[0]
    except Exception as e:  # noqa: BLE001 (a launch the compiler rejects)
        print(f"  {name:52} failed: {type(e).__name__}", flush=True)
        return float("inf")
    print(f"  {name:52} {ms:7.4f} ms/token", flush=True)
    return ms


def descend(model, steps: int, grids: list[bool]) -> dict:
    """Each GEMV's launch chosen by the whole step, one kernel at a time, a pass per grid (True: the quick list);
    returns {(table, key): launch} changed."""
    tables, chosen = model.backend.launches, {}
    best = timed(model, steps, "committed")
    for table, key, candidates in (job for quick in grids for job in jobs(model, quick)):
        current = tables[table].get(key)
        for launch in candidates:
            if launch == current:
                continue
            put(tables, table, key, launch)
            ms = timed(model, steps, label(table, key, launch))
            if ms < best * (1 - NOISE):
                best, current, chosen[(table, key)] = ms, launch, launch
        put(tables, table, key, current)
    return chosen


def confirm(model, chosen: dict, committed: dict, steps: int, pdl: bool) -> None:
    """The committed and chosen tables in turn, three times each (pdl: the chosen ones under it, the committed
    ones as gemv.use_pdl has them)."""
    tables = model.backend.launches
    for _ in range(3):
        for name, pick in (("committed", committed), ("chosen", chosen)):
            for (table, key), launch in pick.items():
                put(tables, table, key, launch)
            with pdl_everywhere(pdl and name == "chosen"):
                timed(model, steps, name)


def ab(model, steps: int) -> None:
    """This GPU's tables against the committed ones alone (what any other GPU reads), in turn, three times each."""
    tables = model.backend.launches
    own = {name: dict(table) for name, table in tables.items()}
    for _ in range(3):
        for name, pick in (("committed alone", committed_launches(None)), ("this GPU's", own)):
            for table, entries in pick.items():
                tables[table].clear()
                tables[table].update(entries)
            timed(model, steps, name)


class pdl_everywhere:
    """gemv.use_pdl true for every weight PDL can take (on: else as it is)."""

    def __init__(self, on: bool):
        self.on, self.was = on, gemv.use_pdl

    def __enter__(self):
        if self.on:
            gemv.use_pdl = lambda w: pdl_capable(w.data.device)

    def __exit__(self, *exc):
        gemv.use_pdl = self.was


def build(shape: str, weights: str, world: int):
    """The model walked: random weights of `shape`, or with world > 1 rank 0's shard with no communication."""
    if weights in BLOCK_FORMATS:
        if world > 1:
            raise SystemExit("--world takes bf16 weights only (tensor parallel runs bf16)")
        return tuned(random_block_models(shape, torch.device("cuda"), DType.bfloat16, Backend.triton,
                                         [WeightFormat(weights)])[0].model)
    fp8 = FP8Format(weights.removeprefix("fp8_")) if weights.startswith("fp8_") else None
    if world == 1:
        return random_model(shape, torch.device("cuda"), DType.bfloat16, Backend.triton, fp8=fp8).model
    if fp8 is not None:
        raise SystemExit("--world takes bf16 weights only (tensor parallel runs bf16)")
    return floor_model(shape, world, torch.device("cuda"))


def tuned(model):
    """model with the launches tuning on first use gives it (no table holds a block format's): the walk's start."""
    plan = tuning.prepare(model)
    if plan is not None:
        print(f"tuned on first use in {tuning.tune(plan).seconds:.1f} s", flush=True)
    return model


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="llama-2-7b")
    p.add_argument("--weights", nargs="+", default=["bf16", "fp8_e5m2"])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--grids", nargs="+", choices=["quick", "full"], default=["quick"], help="a pass per grid")
    p.add_argument("--pdl", action="store_true", help="FP8 GEMVs under programmatic dependent launch too")
    p.add_argument("--ab", action="store_true", help="this GPU's tables against the committed ones alone")
    p.add_argument("--world", type=int, default=1, help="rank 0's shard of this tensor-parallel size, no communication")
    a = p.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    for weights in a.weights:
        t0 = time.perf_counter()
        model = build(a.shape, weights, a.world)
        print(f"{a.shape} {weights}{f', rank 0 of {a.world}, no communication' if a.world > 1 else ''}", flush=True)
        if a.ab:
            ab(model, a.steps)
            del model
            torch.cuda.empty_cache()
            continue
        tables = model.backend.launches
        before = {(t, k): tables[t].get(k) for t, k, _ in jobs(model)}
        if a.pdl:
            timed(model, a.steps, "committed, no PDL")
        with pdl_everywhere(a.pdl):
            chosen = descend(model, a.steps, [g == "quick" for g in a.grids])
        print(f"chosen{' under PDL' if a.pdl else ''}: {chosen or 'the committed launches'}", flush=True)
        if chosen or a.pdl:
            confirm(model, chosen, {tk: before[tk] for tk in chosen}, a.steps, a.pdl)
        print(f"{weights}: {time.perf_counter() - t0:.0f} s", flush=True)
        del model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
