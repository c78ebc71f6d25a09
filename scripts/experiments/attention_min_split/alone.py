"""Decode attention alone, as tuning on first use times it, in a cache of 4,096 positions: the launch tuning picks
at the full cache (the quick list) and the GPU's committed one, each with every way of cutting the cache into
splits (tuning.sweep.split_candidates, and min_split 512), at each length in use; µs a call, the median of 10
replays of a CUDA graph over input sets that flush L2 (tuning.sweep.sweep_splits at one length each), then the
cut that tuning picks over SPLIT_LENGTHS. bf16. The graphed step's verdicts to compare with are in
../attention_splits/: a cut gained at 7B and 13B, and lost at 70B.

    PYTHONPATH=. python scripts/experiments/attention_min_split/alone.py llama-2-7b llama-2-13b llama-2-70b
"""

from __future__ import annotations

import dataclasses
import importlib
import sys

import torch
from llamafast.kernels.decode_attention import attention_config

from llamafast import tuning
from llamafast.backends import committed_launches
from llamafast.config import model_config

LENGTHS = (32, 64, 144, 272, 512, 1024, 2048)
CONTEXT = 4096
sweeps = importlib.import_module("llamafast.tuning.sweep")  # the package exports its function `sweep`


def one_length(config, base, n: int) -> dict:
    """Each cut's µs at n positions in use."""
    keep = sweeps.SPLIT_LENGTHS, sweeps.split_candidates
    sweeps.SPLIT_LENGTHS = (n,)
    sweeps.split_candidates = lambda launch: [*keep[1](launch), dataclasses.replace(launch, min_split=512)]
    try:
        s = sweeps.sweep_splits(config, torch.bfloat16, torch.device("cuda"), base, CONTEXT,
                                most_sets=tuning.MOST_SETS)
    finally:
        sweeps.SPLIT_LENGTHS, sweeps.split_candidates = keep
    return s.times


def main() -> None:
    gpu = torch.cuda.get_device_name()
    print(gpu, torch.__version__, flush=True)
    for shape in sys.argv[1:]:
        config = dataclasses.replace(model_config(shape), max_seq_len=CONTEXT)
        key = (config.n_kv_heads, config.n_heads // config.n_kv_heads)
        full = sweeps.sweep("decode_attention", config, torch.bfloat16, torch.device("cuda"), None, CONTEXT,
                            quick=True, most_sets=tuning.MOST_SETS)
        committed = attention_config(*key, committed_launches(gpu)["decode_attention"])
        print(f"{shape} {key}: tuned at {CONTEXT} positions {full.best} ({full.times[full.best]:.2f} µs); "
              f"committed {committed}", flush=True)
        for name, base in (("tuned", full.best), ("committed", dataclasses.replace(committed, min_split=0))):
            rows = {n: one_length(config, base, n) for n in LENGTHS}
            print(f"  {name} base {base.n_splits} splits, block {base.block_s}, {base.num_warps} warps; "
                  f"µs at each length in use:", flush=True)
            print("    min_split " + " ".join(f"{n:>7}" for n in rows), flush=True)
            for cut in next(iter(rows.values())):
                print(f"    {cut.min_split:9} " + " ".join(f"{rows[n][cut]:7.2f}" for n in rows), flush=True)
            pick = sweeps.sweep_splits(config, torch.bfloat16, torch.device("cuda"), base, CONTEXT,
                                       most_sets=tuning.MOST_SETS)
            print(f"    tuning picks min_split {pick.best.min_split} over {sweeps.SPLIT_LENGTHS}: " +
                  ", ".join(f"{c.min_split} {t:.2f}" for c, t in pick.times.items()), flush=True)


if __name__ == "__main__":
    main()
