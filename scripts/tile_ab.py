"""A/B/C of prefill launch choices end to end: time to first token on Llama-2-7B random weights (bf16), each
variant in turn, twice, in one process. A: the shipped tables; B: 128 x 256 tiles above 1,024 rows (the TMA
path); C: B with TMA loads from 512 rows.

    python scripts/tile_ab.py [--lengths 128,512,2048,4000] [--reps 7]
"""

from __future__ import annotations

import argparse
import importlib
import statistics

import torch
from llamafast.kernels.tiles import TileConfig

from llamafast.bench_prefill import time_prefill
from llamafast.config import Backend, DType, SamplingConfig
from llamafast.generate import Engine
from llamafast.load import random_model

linear, qkv, tiles = (
    importlib.import_module(f"llamafast.kernels.{n}") for n in ("prefill_linear", "prefill_qkv_rope", "tiles")
)
T = TileConfig
# B keeps A's launches up to 1,024 rows (pointer loads there) and takes tune_prefill_tma.txt's winners above.
WIDE = ({256: T(64, 64, 64, 4, 4), 1024: T(128, 128, 64, 8, 4), 4096: T(128, 256, 64, 8, 3)},
        {1024: T(128, 128, 64, 8, 4), 4096: T(128, 256, 64, 8, 4)})
VARIANTS = {  # (linear CONFIGS, qkv CONFIGS, TMA_MIN_ROWS)
    "A": (dict(linear.CONFIGS), dict(qkv.CONFIGS), tiles.TMA_MIN_ROWS),
    "B": (*WIDE, 1024),
    "C": (*WIDE, 512),
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--lengths", default="128,512,2048,4000")
    p.add_argument("--reps", type=int, default=7)
    a = p.parse_args()
    lengths = [int(n) for n in a.lengths.split(",")]
    lm = random_model("llama-2-7b", torch.device("cuda"), DType.bfloat16, Backend.triton)
    engine = Engine(lm.model, SamplingConfig(temperature=0), max(lengths) + 1)
    gen = torch.Generator().manual_seed(0)
    prompts = {n: [1] + torch.randint(3, 32000, (n - 1,), generator=gen).tolist() for n in lengths}
    results: dict[tuple[str, int], list[float]] = {}
    for label in [*VARIANTS, *VARIANTS]:
        linear.CONFIGS, qkv.CONFIGS, tiles.TMA_MIN_ROWS = VARIANTS[label]
        for n, ids in prompts.items():
            time_prefill(engine, ids, 2)  # compile and warm
            results.setdefault((label, n), []).extend(time_prefill(engine, ids, a.reps))
    print(f"median of {2 * a.reps} ms (min); B/A and C/A of the medians")
    print(f"{'length':>6}" + "".join(f"{lab:>18}" for lab in VARIANTS) + f"{'B/A':>7}{'C/A':>7}")
    for n in lengths:
        med = {lab: statistics.median(results[(lab, n)]) * 1e3 for lab in VARIANTS}
        cells = "".join(f"{med[lab]:9.2f} ({min(results[(lab, n)]) * 1e3:6.2f})" for lab in VARIANTS)
        print(f"{n:6d}{cells}{med['B'] / med['A']:7.3f}{med['C'] / med['A']:7.3f}")


if __name__ == "__main__":
    main()
