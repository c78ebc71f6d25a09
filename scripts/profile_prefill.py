"""Per-kernel GPU time of one 7B prefill on the triton backend (torch.profiler), at each prompt length.

    PYTHONPATH=. python scripts/profile_prefill.py [--lengths 512,4000] [--backend triton]
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from llamafast.bench_prefill import time_prefill
from llamafast.config import Backend, DType, SamplingConfig
from llamafast.generate import Engine
from llamafast.load import random_model


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--lengths", default="512,4000")
    p.add_argument("--backend", default="triton", choices=[b.value for b in Backend])
    a = p.parse_args()
    lm = random_model("llama-2-7b", torch.device("cuda"), DType.bfloat16, Backend(a.backend))
    for n in (int(x) for x in a.lengths.split(",")):
        engine = Engine(lm.model, SamplingConfig(temperature=0), n + 1)
        ids = [1] + torch.randint(3, 32000, (n - 1,), generator=torch.Generator().manual_seed(0)).tolist()
        time_prefill(engine, ids, 2)  # warm-up
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            time_prefill(engine, ids, 1)
        print(f"== {a.backend}, {n} prompt tokens")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60))


if __name__ == "__main__":
    main()
