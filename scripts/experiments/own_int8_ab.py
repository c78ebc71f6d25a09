"""Where a block GEMV should round its own int8 activations (GemvConfig.own_int8) rather than read them from a
quantize pass launched before it, timed in one process: random weights of a shape in bf16 and in each block format
named, each format's decode kernels swept over tuning's quick list twice (with a quantize pass, and rounding their
own activations, as tuning/sweep.sweep times block launches), the best of each printed per kernel, then each copy
decoded with the pass-only winners and with the overall winners, alternated twice, bf16 beside them.

    PYTHONPATH=. python scripts/experiments/own_int8_ab.py SHAPE FORMAT [FORMAT ...]
"""

from __future__ import annotations

import os
import sys

import torch

from llamafast import tuning
from llamafast.bench.decode import bench_backend
from llamafast.config import Backend, WeightFormat
from llamafast.load import block_copy, random_model
from llamafast.measure.common import copy_bandwidth, random_prompt
from llamafast.runtime import ready_built
from llamafast.tuning.cache import Entry
from llamafast.tuning.sweep import sweep


def winners(lm) -> tuple[dict, dict]:
    """(the fastest launch with a quantize pass, the fastest of all) per decode GEMV key of lm's block weights."""
    passed, best = {}, {}
    for job in tuning.model_jobs(lm.model):
        if not isinstance(job.fp8, WeightFormat):
            continue
        s = sweep(job.kernel, lm.model.config, torch.bfloat16, torch.device("cuda"), job.fp8, quick=True,
                  most_sets=tuning.MOST_SETS)
        own = {launch: us for launch, us in s.times.items() if launch.own_int8}
        pas = {launch: us for launch, us in s.times.items() if not launch.own_int8}
        p, o = min(pas, key=pas.get), min(own, key=own.get)
        print(f"  {job.kernel:20} {str(job.key):24} pass {pas[p]:6.2f} us {p}  own {own[o]:6.2f} us {o}", flush=True)
        passed[(job.table, job.key)] = Entry(p, pas[p])
        best[(job.table, job.key)] = Entry(o, own[o]) if own[o] < pas[p] else Entry(p, pas[p])
    return passed, best


def main() -> None:
    shape, formats = sys.argv[1], [WeightFormat(f) for f in sys.argv[2:]]
    device = torch.device("cuda")
    bf16 = random_model(shape, device)
    ready_built(bf16)  # bf16 tuned on first use, as bench does
    os.environ["LLAMAFAST_TUNE"] = "0"  # the copies take the sweeps' winners below
    prompt = random_prompt(16, bf16.model.config.vocab_size, torch.Generator().manual_seed(0))
    bw = copy_bandwidth(device)
    print(f"{torch.cuda.get_device_name(device)}; {shape}; copy bandwidth {bw:.0f} GB/s; 16 + 256 tokens", flush=True)
    for fmt in formats:
        lm = block_copy(bf16, fmt)
        ready_built(lm)
        print(f"{fmt.value}: kernel sweeps (tuning's quick list), microseconds per call", flush=True)
        passed, best = winners(lm)
        for rep in (1, 2):
            r = bench_backend(bf16, Backend.triton, prompt, 256)
            print(f"{'bf16':6} run {rep}: {r.decode_tokens_per_s:.1f} tok/s", flush=True)
            for name, table in (("pass", passed), ("best", best)):
                tuning.override(lm.model, table)
                r = bench_backend(lm, Backend.triton, prompt, 256)
                print(f"{fmt.value:6} run {rep} {name}: {r.decode_tokens_per_s:.1f} tok/s, "
                      f"{100 * r.achieved_gb_s / bw:.1f}% of copy BW", flush=True)
        del lm
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
