"""Decode attention's splits cut from the current length against from the cache's size, timed in one process.
decode_attention cut the cache into splits of a fixed length (AttentionConfig.split_len of the cache's size),
so with a 4,096-position cache (chat's and serve's default for Llama 2) every context up to 512 positions at 7B
was walked by one program per KV head. With min_split m > 0 the kernel cuts the current length into its grid's
splits, each at least m positions. Random weights of SHAPE (bf16 and FP8 E5M2, or the FP8 copy alone), greedy
decode steps after a PROMPT-token prompt, each way in turn, twice. The ways: the model's attention launch with
min_split 0 in a cache of prompt + 264 positions, then in one of --cache positions with min_split 0 and each of
--min-splits, and each of --launches (n_splits,block_s,warps,min_split;...) there, each in a copy of its tables.
(Run 1 set min_split through a module global, before AttentionConfig had the field.)

    PYTHONPATH=. python scripts/experiments/attention_splits/ab.py llama-2-7b [--fp8|--fp8-only] [--prompt 16]
        [--min-splits 32,64] [--launches "16,32,2,32;8,64,4,64"]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import pathlib

from llamafast.backends import backend_ops, with_backend
from llamafast.config import Backend
from llamafast.generate import Engine

_spec = importlib.util.spec_from_file_location("op_cost", pathlib.Path(__file__).parents[1] / "op_cost/op_cost.py")
op_cost = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(op_cost)
from llamafast.kernels.decode_attention import AttentionConfig, attention_config  # noqa: E402


def key(model) -> tuple[int, int]:
    c = model.config
    return c.n_kv_heads, c.n_heads // c.n_kv_heads


def label(launch: AttentionConfig) -> str:
    return (f"{launch.n_splits:2} splits, block {launch.block_s:3}, {launch.num_warps} warps, "
            f"MIN_SPLIT {launch.min_split:3}")


def with_launch(model, launch: AttentionConfig):
    """The model on the triton backend with this attention launch, in its own copy of the tables."""
    launches = {name: dict(table) for name, table in model.backend.launches.items()}
    launches["decode_attention"][key(model)] = launch
    out = with_backend(model, Backend.triton)
    out.backend = backend_ops(Backend.triton, launches)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    op_cost.shape_args(p)
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--cache", type=int, default=4096)
    p.add_argument("--min-splits", default="32,64,128,256")
    p.add_argument("--launches", default="")
    a = p.parse_args()
    device, models, prompt = op_cost.started(a)
    small = a.prompt + op_cost.STEPS + 8
    launch = attention_config(*key(models[0].model), models[0].model.backend.launches["decode_attention"])
    print(f"the model's attention launch: {label(launch)}", flush=True)
    base = dataclasses.replace(launch, min_split=0)
    ways = [(small, base), (a.cache, base), *[(a.cache, dataclasses.replace(base, min_split=int(m)))
                                              for m in a.min_splits.split(",") if m]]
    ways += [(a.cache, AttentionConfig(*map(int, launch.split(",")))) for launch in a.launches.split(";") if launch]
    for lm in models:
        engines = {w: Engine(with_launch(lm.model, w[1]), op_cost.GREEDY, w[0]) for w in ways}
        tokens = {}
        for rep in (1, 2):
            for (cache, launch), engine in engines.items():
                us = op_cost.step_us(engine, prompt, device)
                print(f"{lm.weights:9} run {rep}: cache {cache:5} {label(launch)}: {us:8.1f} µs a step, "
                      f"{1e6 / us:6.1f} tok/s", flush=True)
                if rep == 1:
                    engine.prefill(prompt)
                    tokens[cache, launch] = []
                    for _ in range(32):
                        engine.decode()
                        tokens[cache, launch].append(int(engine.token))
        first = next(iter(tokens.values()))
        print(f"{lm.weights:9}: greedy tokens equal over 32 steps: "
              f"{sum(t == first for t in tokens.values())} of {len(tokens)} ways", flush=True)


if __name__ == "__main__":
    main()
