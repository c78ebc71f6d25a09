"""What each op of a decode layer costs inside the graphed step, by leaving it out: random weights of SHAPE (bf16,
with --fp8 their FP8 E5M2 copy too) decode 256 steps after a 16-token prompt on the triton backend, greedy, with
every op, then with one op of every layer replaced by a no-op that returns a buffer of its output's shape (the
tokens are garbage; the GEMVs' time does not depend on their values), in turn, twice. Under programmatic
dependent launch the kernels overlap, so a profiler's per-kernel rows do not split a layer; what the step loses
with an op gone does: that op's own time plus what its boundaries cost, beside the time its weights take at the
copy bandwidth measured in the same run.

    PYTHONPATH=. python scripts/experiments/op_cost/op_cost.py llama-2-7b --fp8
    PYTHONPATH=. python scripts/experiments/op_cost/op_cost.py llama-2-70b --fp8-only
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch

from llamafast.backends import with_backend
from llamafast.measure.common import copy_bandwidth
from llamafast.config import Backend, SamplingConfig
from llamafast.generate import Engine
from llamafast.load import quantized, random_model
from llamafast.measure.common import random_prompt
from llamafast.quant import FP8Format
from llamafast.runtime import ready_built

STEPS = 256
GREEDY = SamplingConfig(temperature=0, seed=1)


def timed(fn, device) -> float:
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def step_us(engine: Engine, prompt: list[int], device) -> float:
    engine.prefill(prompt)
    for _ in range(3):
        engine.decode()  # captures the graph
    engine.prefill(prompt)
    return 1e6 * timed(lambda: [engine.decode() for _ in range(STEPS)], device) / STEPS


class Static:
    """One zeroed buffer per shape and dtype, the same tensor on every call (graph capture keeps its address)."""

    def __init__(self):
        self.bufs = {}

    def __call__(self, shape, like: torch.Tensor) -> torch.Tensor:
        key = (tuple(shape), like.dtype)
        if key not in self.bufs:
            self.bufs[key] = torch.zeros(shape, dtype=like.dtype, device=like.device)
        return self.bufs[key]


def without(ops, op: str, dim: int, static: Static):
    """ops with `op` of every layer a no-op."""
    if op == "qkv":
        def qkv(x, norm_w, wqkv, cos, sin, pos, k_cache, v_cache, eps, **kw):
            h = (wqkv.shape[0] - 2 * k_cache.shape[0] * k_cache.shape[2]) // k_cache.shape[2]
            return static((1, h, k_cache.shape[2]), x)
        return dataclasses.replace(ops, rmsnorm_qkv_rope=qkv)
    if op == "attention":
        return dataclasses.replace(ops, attention=lambda q, k, v, pos, **kw: static((1, q.shape[1] * q.shape[2]), q))
    if op == "swiglu":
        return dataclasses.replace(ops, rmsnorm_swiglu=lambda x, g, w1, w3, eps, **kw: static((1, w1.shape[0]), x))
    real = ops.linear_residual
    square = op == "wo"

    def linear(x, w, residual, **kw):
        if (w.shape[0] == w.shape[1]) == square:
            return residual
        return real(x, w, residual, **kw)
    return dataclasses.replace(ops, linear_residual=linear)


OPS = ("qkv", "attention", "wo", "swiglu", "w2")


def shape_args(p: argparse.ArgumentParser) -> None:
    """SHAPE, --fp8 and --fp8-only, as ready_models reads them (the A/B scripts beside this one take them too)."""
    p.add_argument("shape")
    p.add_argument("--fp8", action="store_true")
    p.add_argument("--fp8-only", action="store_true", help="the FP8 copy alone, drawn tensor by tensor (70B)")


def ready_models(a: argparse.Namespace, device) -> list:
    """Random weights of a.shape in bf16 (with a.fp8 their FP8 E5M2 copy beside them), or the FP8 copy alone,
    each with its launches tuned."""
    if a.fp8_only:
        models = [random_model(a.shape, device, fp8=FP8Format.e5m2)]
    else:
        base = random_model(a.shape, device)
        models = [base, quantized(base, FP8Format.e5m2)] if a.fp8 else [base]
    for lm in models:
        ready_built(lm)
    return models


def ab_started(*flags: str) -> tuple:
    """An A/B script's start: SHAPE, --fp8, --fp8-only, --prompt (default 16) and the script's own on/off flags
    parsed, then started: (args, device, models, prompt)."""
    p = argparse.ArgumentParser()
    shape_args(p)
    p.add_argument("--prompt", type=int, default=16)
    for flag in flags:
        p.add_argument(flag, action="store_true")
    a = p.parse_args()
    return (a, *started(a))


def alternate(lm, ways: list[str], use, steps_ahead: int, prompt: list[int], device) -> None:
    """Times lm's graphed step on the triton backend each way in turn, twice, `use(way)` setting its launches before
    the way's engine captures or replays; prints each way's µs a step and how many of its first 32 greedy tokens
    equal the first way's (the baseline)."""
    engines = {w: Engine(with_backend(lm.model, Backend.triton), GREEDY, steps_ahead + STEPS + 8) for w in ways}
    tokens = {}
    for w, engine in engines.items():
        use(w)
        tokens[w] = greedy_tokens(engine, prompt)
    width = max(map(len, ways))
    for rep in (1, 2):
        for w, engine in engines.items():
            use(w)
            us = step_us(engine, prompt, device)
            same = sum(x == y for x, y in zip(tokens[w], tokens[ways[0]]))
            print(f"{lm.weights:9} run {rep}: {w:{width}} {us:8.1f} µs a step, {1e6 / us:7.1f} tok/s; greedy tokens "
                  f"{same}/32 as {ways[0]}", flush=True)


def greedy_tokens(engine: Engine, prompt: list[int], n: int = 32) -> list[int]:
    """The first n tokens the engine picks after the prompt (as its launches are now: the first decode captures)."""
    engine.prefill(prompt)
    tokens = []
    for _ in range(n):
        engine.decode()
        tokens.append(int(engine.token))
    return tokens


def started(a: argparse.Namespace) -> tuple:
    """ready_models on the GPU and a random prompt of a.prompt tokens, the run's header printed: (device, models,
    prompt)."""
    device = torch.device("cuda")
    models = ready_models(a, device)
    prompt = random_prompt(a.prompt, models[0].model.config.vocab_size, torch.Generator().manual_seed(0))
    print(f"{a.shape} on {torch.cuda.get_device_name(device)}; {a.prompt} + {STEPS} tokens, greedy; "
          f"copy bandwidth {copy_bandwidth(device):.0f} GB/s", flush=True)
    return device, models, prompt


def layer_bytes(model) -> dict[str, int]:
    """Each op's weight bytes in one layer."""
    b = model.layers[0]
    size = lambda w: w.data.numel() * w.data.element_size() + (0 if w.scale is None else w.scale.numel() * 4)
    ffn = b.feed_forward
    return {"qkv": size(b.attention.qkv), "attention": 0, "wo": size(b.attention.wo.w),
            "swiglu": size(ffn.w1.w) + size(ffn.w3.w), "w2": size(ffn.w2.w)}


def main() -> None:
    p = argparse.ArgumentParser()
    shape_args(p)
    a = p.parse_args()
    device = torch.device("cuda")
    models = ready_models(a, device)
    config = models[0].model.config
    prompt = random_prompt(16, config.vocab_size, torch.Generator().manual_seed(0))
    bw = copy_bandwidth(device)
    print(f"{a.shape} on {torch.cuda.get_device_name(device)}; 16 + {STEPS} tokens, greedy; {config.n_layers} layers;"
          f" copy bandwidth {bw:.0f} GB/s", flush=True)
    static = Static()
    for lm in models:
        engines = {}
        for op in ("every op", *OPS):
            model = with_backend(lm.model, Backend.triton)
            if op != "every op":
                model.backend = dataclasses.replace(model.backend, decode=without(model.backend.decode, op,
                                                                                  config.dim, static))
            engines[op] = Engine(model, GREEDY, len(prompt) + STEPS + 8)
        sizes = layer_bytes(lm.model)
        for rep in (1, 2):
            full = step_us(engines["every op"], prompt, device)
            print(f"{lm.weights:9} run {rep}: every op {full:8.1f} µs per step", flush=True)
            for op in OPS:
                t = step_us(engines[op], prompt, device)
                saved = (full - t) / config.n_layers
                at_bw = sizes[op] / bw / 1e3  # bytes / (GB/s) in µs
                print(f"{lm.weights:9} run {rep}: without {op:9} {t:8.1f} µs per step: {saved:6.2f} µs a layer, its"
                      f" weights {sizes[op] / 1e6:7.2f} MB = {at_bw:6.2f} µs at the copy bandwidth, over by"
                      f" {saved - at_bw:5.2f}", flush=True)


if __name__ == "__main__":
    main()
