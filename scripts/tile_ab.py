"""A/B of prefill launch choices end to end: time to first token on Llama-2-7B random weights (bf16), each
variant in turn, twice, in one process; ratios are against the first variant named.

    python scripts/tile_ab.py [--variants A,B,C] [--lengths 128,512,2048,4000] [--reps 7]

Variants (linear and QKV launch tables, fewest rows for TMA loads, where TMA descriptors are made):
    A      128 x 128 tiles above 1,024 rows (the tables at commit 24c9f7e), TMA from 1,024 rows, host descriptors
    B      128 x 256 tiles above 1,024 rows, TMA from 1,024, host descriptors
    C      B with TMA (host descriptors) from 512 rows
    host   B (tables as shipped since), TMA from 1,024, host descriptors
    devN   B, TMA from N rows, descriptors made on the device at every row count (dev16, dev256, dev1024, ...)
    mixN   B, TMA from N rows, descriptors made on the device below 1,024 rows and on the host from there
"""

from __future__ import annotations

import argparse
import importlib
import statistics

import torch
from llamafast.kernels.tiles import TileConfig

from llamafast.bench.prefill import random_prompts, time_prefill
from llamafast.config import Backend, DType, SamplingConfig
from llamafast.generate import Engine
from llamafast.load import random_model

linear, qkv, tiles = (
    importlib.import_module(f"llamafast.kernels.{n}") for n in ("prefill_linear", "prefill_qkv_rope", "tiles")
)
T = TileConfig
NARROW = ({256: T(64, 64, 64, 4, 4), 4096: T(128, 128, 64, 8, 4)}, {4096: T(128, 128, 64, 8, 4)})
WIDE = ({256: T(64, 64, 64, 4, 4), 1024: T(128, 128, 64, 8, 4), 4096: T(128, 256, 64, 8, 3)},
        {1024: T(128, 128, 64, 8, 4), 4096: T(128, 256, 64, 8, 4)})


def variant(label: str) -> tuple:
    """(linear CONFIGS, qkv CONFIGS, TMA_MIN_ROWS, HOST_DESCRIPTOR_ROWS)"""
    fixed = {"A": (*NARROW, 1024, 1024), "B": (*WIDE, 1024, 1024), "C": (*WIDE, 512, 512), "host": (*WIDE, 1024, 1024)}
    if label in fixed:
        return fixed[label]
    if label.startswith("dev"):
        return (*WIDE, int(label[3:]), 1 << 30)
    if label.startswith("mix"):
        return (*WIDE, int(label[3:]), 1024)
    raise SystemExit(f"unknown variant {label!r}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--variants", default="A,B,C")
    p.add_argument("--lengths", default="128,512,2048,4000")
    p.add_argument("--reps", type=int, default=7)
    a = p.parse_args()
    labels = a.variants.split(",")
    variants = {label: variant(label) for label in labels}
    lengths = [int(n) for n in a.lengths.split(",")]
    lm = random_model("llama-2-7b", torch.device("cuda"), DType.bfloat16, Backend.triton)
    engine = Engine(lm.model, SamplingConfig(temperature=0), max(lengths) + 1)
    prompts = random_prompts(lengths, lm.model.config.vocab_size)
    results: dict[tuple[str, int], list[float]] = {}
    for label in labels * 2:
        linear.CONFIGS, qkv.CONFIGS, tiles.TMA_MIN_ROWS, tiles.HOST_DESCRIPTOR_ROWS = variants[label]
        for n, ids in prompts.items():
            time_prefill(engine, ids, 2)  # compile and warm
            results.setdefault((label, n), []).extend(time_prefill(engine, ids, a.reps))
    first = labels[0]
    print(f"median of {2 * a.reps} ms (min); ratios of the medians to {first}")
    print(f"{'length':>6}" + "".join(f"{lab:>18}" for lab in labels) + "".join(f"{lab:>8}" for lab in labels[1:]))
    for n in lengths:
        med = {lab: statistics.median(results[(lab, n)]) * 1e3 for lab in labels}
        cells = "".join(f"{med[lab]:9.2f} ({min(results[(lab, n)]) * 1e3:6.2f})" for lab in labels)
        print(f"{n:6d}{cells}" + "".join(f"{med[lab] / med[first]:8.3f}" for lab in labels[1:]))


if __name__ == "__main__":
    main()
