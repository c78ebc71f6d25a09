"""Block-format decode GEMVs on float activations (GemvConfig.float_blocks) against the launches tuning picks
without them, and bf16, at one shape in one process.

Each block model is tuned on first use as every command tunes it (float_blocks among the candidates where K is
small: tuning.sweep.FLOAT_BLOCKS_MAX_K); each GEMV whose winner multiplies float activations is swept again
without them, for the launch tuning picked before they existed. The bf16 model of the same random numbers is
tuned too. Then the three step in turn, three times each, timed in the graphed step (step_launches.timed).
Random weights; from the repository root, on one GPU:

    python scripts/experiments/float_blocks/ab.py --shape smollm2-135m --weights q4_1 q8_0
"""
import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from step_launches import jobs, put, timed  # noqa: E402

from llamafast.config import Backend, DType, WeightFormat  # noqa: E402
from llamafast.load import random_model  # noqa: E402
from llamafast.load.build import random_block_models  # noqa: E402
from llamafast.runtime import tune  # noqa: E402
from llamafast.tuning import model_jobs  # noqa: E402
from llamafast.tuning import sweep as sweeps  # noqa: E402

sweep_module = sys.modules["llamafast.tuning.sweep"]


def without_float(model) -> dict:
    """{(table, key): the fastest launch on int8 activations} for each GEMV whose tuned launch takes float ones."""
    tables, out = model.backend.launches, {}
    kept = sweep_module.FLOAT_BLOCKS_MAX_K
    sweep_module.FLOAT_BLOCKS_MAX_K = 0
    try:
        for job in model_jobs(model):
            launch = tables.get(job.table, {}).get(job.key)
            if launch is not None and getattr(launch, "float_blocks", False):
                s = sweeps(job.kernel, model.config, torch.bfloat16, torch.device("cuda"), job.fp8, quick=True,
                           most_sets=64)
                out[(job.table, job.key)] = s.best
                print(f"  {job.table} {job.key}: tuned {launch}; on int8 activations {s.best} "
                      f"({s.times[s.best]:.2f} us)", flush=True)
    finally:
        sweep_module.FLOAT_BLOCKS_MAX_K = kept
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="smollm2-135m")
    p.add_argument("--weights", nargs="+", default=["q4_1", "q8_0"])
    p.add_argument("--steps", type=int, default=300)
    a = p.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    t0 = time.perf_counter()
    bf16 = random_model(a.shape, torch.device("cuda"), DType.bfloat16, Backend.triton).model
    tune(bf16)
    fmts = [WeightFormat(w) for w in a.weights]
    models = [lm.model for lm in random_block_models(a.shape, torch.device("cuda"), DType.bfloat16, Backend.triton,
                                                     fmts)]
    ways = []
    for fmt, model in zip(fmts, models):
        tuned = tune(model)
        print(f"{a.shape} {fmt.value}: {len(tuned.plan.missing) if tuned else 0} keys tuned", flush=True)
        tables = model.backend.launches
        for t, k, _ in jobs(model):
            print(f"  tuned: {t} {k}: {tables[t].get(k)}", flush=True)
        own = {(t, k): tables[t].get(k) for t, k, _ in jobs(model)}
        ways.append((f"{fmt.value}, tuned", model, own))
        ways.append((f"{fmt.value}, int8 activations only", model, {**own, **without_float(model)}))
    print(f"built and tuned in {time.perf_counter() - t0:.0f} s", flush=True)
    for _ in range(3):
        timed(bf16, a.steps, "bf16")
        for name, model, launches in ways:
            for (t, k), launch in launches.items():
                put(model.backend.launches, t, k, launch)
            timed(model, a.steps, name)


if __name__ == "__main__":
    main()
