"""RMSNorm + QKV and attention in one kernel (kernels/qkv_attention.py) against the two kernels, by context length,
timed in one process on a GPU: random weights of SHAPE (bf16, with --fp8 their FP8 E5M2 copy too) on the triton
backend, greedy; at each context a prompt of that many tokens, then the decode graph replayed 64 times, each way
in turn, twice. The fused ways differ in the tail's walk (positions a step, steps in flight); the two kernels are
the backend with short_len 0.

    PYTHONPATH=. python scripts/experiments/qkv_attention/qkv_attention_ab.py llama-2-7b --fp8
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import pathlib
import time

import torch

from llamafast.backends import with_backend
from llamafast.config import Backend, SamplingConfig
from llamafast.generate import Engine
from llamafast.measure.common import copy_bandwidth, random_prompt

_spec = importlib.util.spec_from_file_location("op_cost", pathlib.Path(__file__).parents[1] / "op_cost/op_cost.py")
op_cost = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(op_cost)

STEPS = 64
CONTEXTS = (24, 128, 272, 512, 1024)
GREEDY = SamplingConfig(temperature=0, seed=1)
# name -> (short_len, the tail's BLOCK_S, STAGES)
WAYS = {
    "two kernels": (0, None, None),
    "fused, 16 a step, 2 in flight": (1 << 20, 16, 2),
    "fused, 16 a step, 3 in flight": (1 << 20, 16, 3),
    "fused, 32 a step, 2 in flight": (1 << 20, 32, 2),
    "fused, 16 a step, 1 in flight": (1 << 20, 16, 1),
}
qa = importlib.import_module("llamafast.kernels.qkv_attention")


def timed(fn, device) -> float:
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def engine_for(lm, way, prompt, device) -> Engine:
    """An engine whose decode graph is captured now, with the tail's constants of `way` baked in."""
    short_len, block_s, stages = WAYS[way]
    model = with_backend(lm.model, Backend.triton)
    model.backend = dataclasses.replace(model.backend, short_len=short_len)
    engine = Engine(model, GREEDY, max(CONTEXTS) + STEPS + 8)
    if block_s is not None:
        qa.BLOCK_S, qa.STAGES = block_s, stages
    engine.prefill(prompt[:CONTEXTS[0]])
    engine.decode()
    return engine


def step_us(engine: Engine, prompt: list[int], device) -> float:
    engine.prefill(prompt)
    engine.decode()
    return 1e6 * timed(lambda: [engine.decode() for _ in range(STEPS)], device) / STEPS


def main() -> None:
    p = argparse.ArgumentParser()
    op_cost.shape_args(p)
    a = p.parse_args()
    device = torch.device("cuda")
    models = op_cost.ready_models(a, device)
    vocab = models[0].model.config.vocab_size
    prompt = random_prompt(max(CONTEXTS), vocab, torch.Generator().manual_seed(0))
    print(f"{a.shape} on {torch.cuda.get_device_name(device)}; copy bandwidth {copy_bandwidth(device):.0f} GB/s;"
          f" {STEPS} greedy steps after a prompt of each context", flush=True)
    for lm in models:
        engines = {way: engine_for(lm, way, prompt, device) for way in WAYS}
        for rep in (1, 2):
            for n in CONTEXTS:
                row = [f"{step_us(e, prompt[:n], device):7.1f}" for e in engines.values()]
                print(f"{lm.weights:9} run {rep} context {n:5}: µs per step, " + ", ".join(
                    f"{way} {t}" for way, t in zip(WAYS, row)), flush=True)


if __name__ == "__main__":
    main()
