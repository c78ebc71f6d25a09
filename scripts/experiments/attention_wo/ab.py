"""Attention and wo in one launch (kernels/attention_wo.py) against the two kernels apart, timed in one process:
random weights of SHAPE (bf16, and their FP8 E5M2 copy with --fp8; the FP8 copy alone with --fp8-only), greedy
decode steps on the triton backend after a PROMPT-token prompt, each way in turn, twice. The fused launch runs
with wo's launch from the model's table, then with each of VARIANTS (block_n, block_k, warps) for its key.

    PYTHONPATH=. python scripts/experiments/attention_wo/ab.py llama-2-7b --fp8 [--prompt 16] [--variants]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import pathlib


from llamafast.backends import with_backend
from llamafast.config import Backend
from llamafast.generate import Engine

_spec = importlib.util.spec_from_file_location("op_cost", pathlib.Path(__file__).parents[1] / "op_cost/op_cost.py")
op_cost = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(op_cost)
kernels = importlib.import_module("llamafast.kernels")
gemv = importlib.import_module("llamafast.kernels.gemv")

VARIANTS = [(8, 512, 4), (16, 256, 4), (8, 1024, 8), (16, 512, 8)]
SLEEPS = [64, 256, 1024]  # ns between the tile programs' polls of the counter: ways "fused sleep N"
aw = importlib.import_module("llamafast.kernels.attention_wo")


def engines(lm, prompt_len: int, variants: bool) -> dict[str, Engine]:
    out = {}
    wo = lm.model.layers[0].attention.wo.w
    key = gemv.gemv_key(wo)
    ways = ["apart", "fused"] + ([f"fused {v}" for v in VARIANTS] if variants else [])
    ways += [f"fused sleep {ns}" for ns in SLEEPS]
    for way in ways:
        model = with_backend(lm.model, Backend.triton)
        ops = model.backend.decode
        if way == "apart":
            ops = dataclasses.replace(ops, attention_wo=None)
        elif way != "fused" and "sleep" not in way:
            bn, bk, nw = VARIANTS[ways.index(way) - 2]
            base = gemv.gemv_config(model.backend.launches["linear_residual"], wo)
            table = {**model.backend.launches["linear_residual"],
                     key: dataclasses.replace(base, block_n=bn, block_k=bk, num_warps=nw)}
            ops = dataclasses.replace(ops, attention_wo=functools.partial(
                kernels.attention_wo, attention_configs=model.backend.launches["decode_attention"], configs=table))
        model.backend = dataclasses.replace(model.backend, decode=ops)
        out[way] = Engine(model, op_cost.GREEDY, prompt_len + op_cost.STEPS + 8)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    op_cost.shape_args(p)
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--variants", action="store_true")
    a = p.parse_args()
    device, models, prompt = op_cost.started(a)
    for lm in models:
        ways = engines(lm, a.prompt, a.variants)
        tokens = {}
        for rep in (1, 2):
            for way, engine in ways.items():
                aw.SLEEP_NS = int(way.split()[-1]) if "sleep" in way else 0
                us = op_cost.step_us(engine, prompt, device)
                print(f"{lm.weights:9} run {rep}: {way:24} {us:8.1f} µs a step, {1e6 / us:6.1f} tok/s", flush=True)
                if rep == 1:
                    engine.prefill(prompt)
                    tokens[way] = []
                    for _ in range(32):
                        engine.decode()
                        tokens[way].append(int(engine.token))
        same = all(t == tokens["apart"] for t in tokens.values())
        print(f"{lm.weights:9}: greedy tokens of every way equal to apart's over 32 steps: {same}", flush=True)
        watchdog = lm.model.layers[0].watchdog if hasattr(lm.model.layers[0], "watchdog") else None
        print(f"{lm.weights:9}: watchdog {None if watchdog is None else watchdog.item()}", flush=True)


if __name__ == "__main__":
    main()
