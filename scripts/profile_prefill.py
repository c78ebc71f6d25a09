"""Per-kernel GPU time of one 7B prefill on the triton backend (torch.profiler), at each prompt length;
with --host, where the host's time goes instead (cProfile) and how long the host takes to queue the prefill.

    PYTHONPATH=. python scripts/profile_prefill.py [--lengths 512,4000] [--backend triton] [--host]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch
from torch.profiler import ProfilerActivity, profile

from llamafast.measure.common import random_prompt
from llamafast.bench.prefill import time_prefill
from llamafast.config import Backend, DType, SamplingConfig
from llamafast.generate import Engine
from llamafast.load import random_model


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--lengths", default="512,4000")
    p.add_argument("--backend", default="triton", choices=[b.value for b in Backend])
    p.add_argument("--host", action="store_true", help="cProfile the host instead of the GPU kernels")
    a = p.parse_args()
    lm = random_model("llama-2-7b", torch.device("cuda"), DType.bfloat16, Backend(a.backend))
    for n in (int(x) for x in a.lengths.split(",")):
        engine = Engine(lm.model, SamplingConfig(temperature=0), n + 1, prompt_graphs=False)  # kernels, queued
        ids = random_prompt(n, 32000, torch.Generator().manual_seed(0))
        time_prefill(engine, ids, 2)  # warm-up
        if a.host:
            host_profile(engine, ids)
            continue
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            time_prefill(engine, ids, 1)
        print(f"== {a.backend}, {n} prompt tokens")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60))


def host_profile(engine: Engine, ids: list[int]) -> None:
    """Host time to queue one prompt's forward passes (no sync) against the time until the logits exist."""
    tokens = torch.tensor(ids, dtype=torch.long, device="cuda")
    queued, done = [], []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        logits = engine.prompt_logits(tokens)
        queued.append(time.perf_counter() - t0)
        logits.sum().item()
        done.append(time.perf_counter() - t0)
    print(f"== host, {len(ids)} prompt tokens: queued in {min(queued) * 1e3:.2f} ms, done in {min(done) * 1e3:.2f} ms")
    prof = cProfile.Profile()
    torch.cuda.synchronize()
    prof.runcall(engine.prompt_logits, tokens)
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
