"""One rank's timeline of TP=2 prompts with the rows in blocks (blocks/tried.diff applied): per block count, 3
warm-up prompts, then 6 timed ones under torch.profiler, each rank writing its chrome trace and every prompt's
time to first token, so slow prompts can be taken apart kernel by kernel on both ranks.

    torchrun --standalone --nproc-per-node 2 scripts/experiments/prompt_push/blocks/trace.py OUTDIR
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from llamafast.config import Backend, DType, SamplingConfig, TPComm
from llamafast.generate import Engine
from llamafast.load import random_model
from llamafast.measure.common import random_prompt
from llamafast.tp.comm import make_comm
from llamafast.tp.dist import finish, setup


def main(out: Path) -> None:
    ranks = setup(None)
    model = random_model("llama-2-7b", ranks.device, DType.bfloat16, Backend.triton, shard=ranks.shard).model
    model.comm = make_comm(TPComm.symm, ranks, model.config, ranks.shard.vocab_sharded(model.config), "graph")[0]
    ids = random_prompt(4000, model.config.vocab_size, torch.Generator().manual_seed(0))
    engine = Engine(model, SamplingConfig(temperature=0), len(ids) + 1, prefill_chunk=4096, prompt_graphs=False)
    times = {}
    for blocks in (2, 4):
        model.comm.prompt_blocks = blocks
        for _ in range(3):
            engine.prefill(ids)
            int(engine.token[0])
        ms = []
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(6):
                dist.barrier(group=ranks.control)
                t0 = time.perf_counter()
                engine.prefill(ids)
                int(engine.token[0])
                ms.append(1e3 * (time.perf_counter() - t0))
        prof.export_chrome_trace(str(out / f"trace_blocks{blocks}_rank{ranks.shard.rank}.json"))
        times[blocks] = ms
        print(f"rank {ranks.shard.rank} blocks {blocks}: " + " ".join(f"{t:.2f}" for t in ms), flush=True)
    (out / f"ttft_rank{ranks.shard.rank}.json").write_text(json.dumps(times))
    dist.barrier(group=ranks.control)
    finish(ranks)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
