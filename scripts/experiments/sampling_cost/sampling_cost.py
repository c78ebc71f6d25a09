"""What sampling adds to a decode step, timed in one process on a GPU: random weights of SHAPE (bf16, with --fp8
their FP8 E5M2 copy too), the engine's decode graph replayed 256 times after a 16-token prompt under each way
of sampling below, with the torch sampler (reference.sample_token) and with the fused one (the triton backend's,
kernels/sample_token.py) in turn, twice; then each sampler alone on random logits of the model's vocabulary,
captured in a CUDA graph and replayed 1,000 times. (Before the fused sampler existed, the script timed the torch
path alone: before/.) --one-program FILE: the fused sampler as it was when one program walked the whole row
(`git show 458735d:kernels/sample_token.py > FILE`, loaded as a module of llamafast.kernels) joins the samplers;
--before FILE: so does a sampler of another commit, "before", its sample_token.py after the passes it imports
(nucleus/command.txt says how FILE was made).

    PYTHONPATH=. python scripts/experiments/sampling_cost/sampling_cost.py smollm2-135m
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import sys
import time

import torch

from llamafast.backends import with_backend
from llamafast import reference
from llamafast.config import Backend, SamplingConfig
from llamafast.generate import Engine
from llamafast.load import quantized, random_model
from llamafast.measure.common import random_prompt
from llamafast.quant import FP8Format
from llamafast.runtime import ready_built
from llamafast.kernels.sample_token import sample_token

STEPS = 256
WAYS = {
    "greedy": SamplingConfig(temperature=0, seed=1),
    "T 0.6, top-p 0.9 (the default)": SamplingConfig(seed=1),
    "T 0.8, top-k 40": SamplingConfig(temperature=0.8, top_k=40, top_p=1.0, seed=1),
    "T 1, no filter": SamplingConfig(temperature=1.0, top_p=1.0, seed=1),
    "T 0.6, top-p 0.9, repetition 1.1": SamplingConfig(repetition_penalty=1.1, seed=1),
}


def timed(fn, device) -> float:
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def step_us(engine: Engine, prompt: list[int], device) -> float:
    engine.prefill(prompt)
    for _ in range(3):
        engine.decode()  # captures this way's graph
    engine.prefill(prompt)
    return 1e6 * timed(lambda: [engine.decode() for _ in range(STEPS)], device) / STEPS


SAMPLERS = {"torch": reference.sample_token, "fused": sample_token}


def one_program(path: str, name: str = "llamafast.kernels.sample_token_one_program"):
    """The sampler in the file at path, imported as the module name."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module.sample_token


def sample_alone_us(vocab: int, cfg: SamplingConfig, sampler, device) -> float:
    logits = torch.randn(vocab, device=device) * 3
    seen = torch.zeros(vocab, dtype=torch.bool, device=device)
    counts = torch.zeros(vocab, dtype=torch.int32, device=device)
    draw = torch.tensor([1, 0], device=device)
    out = torch.zeros(1, dtype=torch.long, device=device)
    out.copy_(sampler(logits, seen, counts, draw, cfg))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out.copy_(sampler(logits, seen, counts, draw, cfg))
    g.replay()
    return 1e6 * timed(lambda: [g.replay() for _ in range(1000)], device) / 1000


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("shape")
    p.add_argument("--fp8", action="store_true")
    p.add_argument("--one-program", help="the file of the sampler whose one program walked the whole row")
    p.add_argument("--before", help="the file of another commit's sampler, its passes inlined")
    a = p.parse_args()
    if a.one_program:
        SAMPLERS["one program"] = one_program(a.one_program)
    if a.before:
        SAMPLERS["before"] = one_program(a.before, "llamafast.kernels.sample_token_before")
    device = torch.device("cuda")
    base = random_model(a.shape, device)
    models = [base, quantized(base, FP8Format.e5m2)] if a.fp8 else [base]
    for lm in models:
        ready_built(lm)
    vocab = base.model.config.vocab_size
    prompt = random_prompt(16, vocab, torch.Generator().manual_seed(0))
    print(f"{a.shape} on {torch.cuda.get_device_name(device)}; 16 + {STEPS} tokens; vocabulary {vocab}", flush=True)
    for lm in models:
        engines = {}
        for sampler, fn in SAMPLERS.items():
            model = with_backend(lm.model, Backend.triton)
            model.backend = dataclasses.replace(model.backend, sample=fn)
            engines[sampler] = Engine(model, WAYS["greedy"], len(prompt) + STEPS + 8)
        for rep in (1, 2):
            for name, cfg in WAYS.items():
                row = []
                for sampler, engine in engines.items():
                    engine.configure(cfg)
                    row.append(f"{sampler} {step_us(engine, prompt, device):8.1f}")
                print(f"{lm.weights:9} run {rep}: {name:34} µs per step: " + ", ".join(row), flush=True)
    for name, cfg in WAYS.items():
        row = [f"{s} {sample_alone_us(vocab, cfg, fn, device):6.1f}" for s, fn in SAMPLERS.items()]
        print(f"alone, {name:34} µs: " + ", ".join(row), flush=True)


if __name__ == "__main__":
    main()
