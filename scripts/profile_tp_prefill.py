"""Where a tensor-parallel prompt's time goes: time to first token of one prompt, per way of summing the ranks'
partials (none: the floor, each rank's arithmetic with no communication; nccl; symm) and per chunk size, beside
the whole model on rank 0's GPU, each with its CUDA kernels' time from torch.profiler grouped by kernel, so the
distance from TP=1's time over the world size is split into arithmetic that runs slower sharded,
communication, and host gaps (the wall time no kernel covers). docs/tensor-parallel.md's prompt breakdown comes
from it.

    torchrun --standalone --nproc-per-node 2 scripts/profile_tp_prefill.py --shape llama-2-7b --tokens 4000 --out OUT.json
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from llamafast.bench.prefill import time_prefill
from llamafast.config import Backend, DType, SamplingConfig, TPComm
from llamafast.generate import PREFILL_CHUNK, TP_PREFILL_CHUNK, Engine
from llamafast.load import random_model
from llamafast.measure.common import environment, random_prompt
from llamafast.tp.comm import make_comm
from llamafast.tp.dist import finish, setup
from profile_tp import NoComm  # scripts/: each rank's partials kept to itself

REPS = 5  # timed prompts per variant (median), after 3 warm-up ones
PROFILED = 2  # prompts under the profiler per variant
TOP = 12  # kernels named in the breakdown; the rest are summed as "other"


def ttft_ms(engine: Engine, ids: list[int], group) -> list[float]:
    """Milliseconds from prompt ids to the first token id on the host, REPS times after 3 warm-up prompts; every
    rank starts each prompt together."""
    times = []
    for _ in range(3 + REPS):
        if group is not None:
            dist.barrier(group=group)
        times += time_prefill(engine, ids, 1)
    return [1e3 * t for t in times[3:]]


def kernels_us(engine: Engine, ids: list[int], group) -> tuple[dict[str, float], float]:
    """(microseconds per prompt of each CUDA kernel, by name, the largest TOP and "other"; wall ms per prompt)."""
    if group is not None:
        dist.barrier(group=group)
    with profile(activities=[ProfilerActivity.CUDA if torch.cuda.is_available() else ProfilerActivity.CPU]) as prof:
        wall = 1e3 * sum(time_prefill(engine, ids, PROFILED)) / PROFILED
    total: dict[str, float] = collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            total[e.name[:60]] += e.device_time / PROFILED
    top = dict(sorted(total.items(), key=lambda kv: -kv[1])[:TOP])
    top["other"] = sum(total.values()) - sum(top.values())
    return top, wall


def measure(name: str, model, ids: list[int], chunk: int, group, leader: bool) -> dict:
    engine = Engine(model, SamplingConfig(temperature=0), len(ids) + 1, prefill_chunk=chunk, prompt_graphs=False)
    times = ttft_ms(engine, ids, group)
    kernels, wall = kernels_us(engine, ids, group)
    row = {"variant": name, "chunk": chunk, "ttft_ms": statistics.median(times), "ttft_ms_min": min(times),
           "profiled_wall_ms": wall, "kernels_ms": sum(kernels.values()) / 1e3, "kernels_us": kernels}
    if leader:
        print(f"{name:24} chunk {chunk:5}  ttft {row['ttft_ms']:8.2f} ms (min {row['ttft_ms_min']:.2f})  "
              f"kernels {row['kernels_ms']:8.2f} ms  profiled wall {wall:8.2f} ms", flush=True)
        for k, us in kernels.items():
            print(f"    {us / 1e3:8.3f} ms  {k}", flush=True)
    del engine
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="llama-2-7b")
    parser.add_argument("--tokens", type=int, default=4000)
    parser.add_argument("--chunks", default=f"{PREFILL_CHUNK},{TP_PREFILL_CHUNK}", help="prompt tokens per forward pass, each timed")
    parser.add_argument("--out", required=True)
    a = parser.parse_args()
    ranks = setup(None)
    backend = Backend.triton if ranks.device.type == "cuda" else Backend.reference  # the CPU: a check of the script
    model = random_model(a.shape, ranks.device, DType.bfloat16, backend, shard=ranks.shard).model
    ids = random_prompt(a.tokens, model.config.vocab_size, torch.Generator().manual_seed(0))
    chunks = [int(c) for c in a.chunks.split(",")]
    config, sharded = model.config, ranks.shard.vocab_sharded(model.config)
    rows = []
    for name, comm in (("none (floor)", NoComm()), ("nccl", make_comm(TPComm.nccl, ranks, config, sharded, "graph")[0]),
                       ("symm", make_comm(TPComm.symm, ranks, config, sharded, "graph")[0])):
        model.comm = comm
        for chunk in chunks:
            rows.append(measure(f"TP={ranks.shard.world} {name}", model, ids, chunk, ranks.group, ranks.leader))
    del model
    if ranks.device.type == "cuda":
        torch.cuda.empty_cache()
    if ranks.leader:  # the whole model on this GPU while the others wait
        whole = random_model(a.shape, ranks.device, DType.bfloat16, backend).model
        for chunk in chunks:
            rows.append(measure("TP=1", whole, ids, chunk, None, True))
        with open(a.out, "w") as f:
            json.dump({"shape": a.shape, "tokens": a.tokens, "world": ranks.shard.world,
                       "environment": environment(ranks.device), "rows": rows}, f, indent=1)
    dist.barrier(group=ranks.control)
    finish(ranks)


if __name__ == "__main__":
    main()
