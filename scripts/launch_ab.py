"""A/B of the prefill kernels' direct launches (kernels/launcher.py) on Llama-2-7B random weights (bf16): time to
first token, and the host's time to queue one prompt's forward pass, with direct launches on and off, in turn,
three times each, in one process.

    python scripts/launch_ab.py [--lengths 128,512,2048] [--reps 7]
"""

from __future__ import annotations

import argparse
import importlib
import statistics

import torch

from llamafast.bench.prefill import host_time, random_prompts, time_prefill
from llamafast.config import Backend, DType, SamplingConfig
from llamafast.generate import Engine
from llamafast.load import random_model

launcher = importlib.import_module("llamafast.kernels.launcher")


def queue_time(engine: Engine, ids: list[int]) -> float:
    """Seconds the host takes to issue the prompt's forward pass, starting with an idle GPU."""
    tokens = torch.tensor(ids, dtype=torch.long, device="cuda")
    return host_time(lambda: engine.prompt_logits(tokens))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--lengths", default="128,512,2048")
    p.add_argument("--reps", type=int, default=7)
    a = p.parse_args()
    lengths = [int(n) for n in a.lengths.split(",")]
    lm = random_model("llama-2-7b", torch.device("cuda"), DType.bfloat16, Backend.triton)
    engine = Engine(lm.model, SamplingConfig(temperature=0), max(lengths) + 1)
    prompts = random_prompts(lengths, lm.model.config.vocab_size)
    ttft: dict[tuple[bool, int], list[float]] = {}
    queued: dict[tuple[bool, int], list[float]] = {}
    for direct in (True, False) * 3:
        launcher.ENABLED = direct
        for n, ids in prompts.items():
            time_prefill(engine, ids, 2)  # compile, fill the launcher's cache, warm
            ttft.setdefault((direct, n), []).extend(time_prefill(engine, ids, a.reps))
            queued.setdefault((direct, n), []).extend(queue_time(engine, ids) for _ in range(3))
    print(f"ms, median (min) of {3 * a.reps} time-to-first-token runs and of 9 queue timings")
    print(f"{'length':>6} {'ttft direct':>17} {'ttft triton':>17} {'ratio':>6} {'queued direct':>17} "
          f"{'queued triton':>17} {'ratio':>6}")
    for n in lengths:
        cells = []
        for table in (ttft, queued):
            on, off = (sorted(table[(d, n)]) for d in (True, False))
            cells.append(f"{statistics.median(on) * 1e3:9.2f} ({on[0] * 1e3:6.2f}) "
                         f"{statistics.median(off) * 1e3:9.2f} ({off[0] * 1e3:6.2f}) "
                         f"{statistics.median(on) / statistics.median(off):6.3f}")
        print(f"{n:6d} " + " ".join(cells))


if __name__ == "__main__":
    main()
