"""Where a decode step's time goes between graphs, timed in one process on a GPU: random weights of SHAPE (bf16,
and with --fp8 their FP8 E5M2 copy), each model decoded 256 tokens after a 16-token prompt four ways:

- stream: bench_backend, the host reading each token as stream_tokens hands it out (`bench decode`'s figure);
- replay: engine.decode() 256 times, the host reading nothing, one synchronize at the end;
- graphs of K steps: K decode steps captured in one CUDA graph, replayed 256 / K times (K = 1, 2, 4, 8).

The per-step time of K-step graphs against K separates what each graph launch costs the GPU (the boundary
between two replays) from the step itself.

    PYTHONPATH=. python scripts/experiments/step_gaps/step_gaps.py llama-2-7b --fp8
"""

from __future__ import annotations

import argparse
import time

import torch

from llamafast.bench.decode import bench_backend
from llamafast.config import Backend
from llamafast.generate import Engine
from llamafast.load import quantized, random_model
from llamafast.measure.common import copy_bandwidth, random_prompt
from llamafast.backends import with_backend
from llamafast.quant import FP8Format
from llamafast.runtime import ready_built
from llamafast.sampling import SamplingConfig

STEPS = 256


def timed(fn, device) -> float:
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def graph_of(engine: Engine, k: int) -> torch.cuda.CUDAGraph:
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(k):
            engine._advance(engine._next_token(engine.token, engine.pos, engine.seen), 1)
    return g


def per_step_us(engine: Engine, prompt: list[int], device, k: int | None) -> float:
    """µs per decode step: the engine's own graph replayed STEPS times (k None), or a k-step graph STEPS / k times."""
    engine.prefill(prompt)
    if k is None:
        return 1e6 * timed(lambda: [engine.decode() for _ in range(STEPS)], device) / STEPS
    g = graph_of(engine, k)
    engine.prefill(prompt)
    g.replay()  # a first replay uploads the graph
    engine.prefill(prompt)
    return 1e6 * timed(lambda: [g.replay() for _ in range(STEPS // k)], device) / STEPS


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("shape")
    p.add_argument("--fp8", action="store_true")
    p.add_argument("--reps", type=int, default=2)
    a = p.parse_args()
    device = torch.device("cuda")
    base = random_model(a.shape, device)
    models = [base, quantized(base, FP8Format.e5m2)] if a.fp8 else [base]
    for lm in models:
        ready_built(lm)
    prompt = random_prompt(16, base.model.config.vocab_size, torch.Generator().manual_seed(0))
    bw = copy_bandwidth(device)
    print(f"{a.shape} on {torch.cuda.get_device_name(device)}; copy bandwidth {bw:.0f} GB/s; 16 + {STEPS} tokens",
          flush=True)
    for lm in models:
        model = with_backend(lm.model, Backend.triton)
        engine = Engine(model, SamplingConfig(temperature=0), len(prompt) + STEPS + 16)
        engine.prefill(prompt)
        for _ in range(4):
            engine.decode()  # captures the engine's graph, compiles the kernels
        torch.cuda.synchronize(device)
        for rep in range(1, a.reps + 1):
            r = bench_backend(lm, Backend.triton, prompt, STEPS)
            row = [f"stream {1e3 * r.decode_ms_per_token:.1f}", f"replay {per_step_us(engine, prompt, device, None):.1f}"]
            row += [f"K={k} {per_step_us(engine, prompt, device, k):.1f}" for k in (1, 2, 4, 8)]
            print(f"{lm.weights:9} run {rep}: µs per step: " + ", ".join(row)
                  + f" ({r.decode_tokens_per_s:.1f} tok/s streamed)", flush=True)


if __name__ == "__main__":
    main()
