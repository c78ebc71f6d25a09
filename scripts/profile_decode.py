"""Where a decode step's time goes: the sparse FFN kernel by kernel, and a tensor-parallel step per way of
communicating. It stays because docs/sparse-ffn.md's kernel split and docs/tensor-parallel.md's floors come from it,
and the floors are what a change to the tensor-parallel step is weighed against (symmetric memory's ticket scope is
still open: docs/benchmarks.md).

    python scripts/profile_decode.py sparse --shape llama-2-7b --out scripts/results/sparse/profile_7b.json
    python scripts/profile_decode.py tp --world 2 --shape llama-2-7b --out scripts/results/tp/floor_tp2_7b.json
    torchrun --standalone --nproc-per-node 2 scripts/profile_decode.py tp --shape llama-2-7b --out OUT.json

sparse: each CUDA kernel's time in the sparse FFN (select, gather, scatter) at half the groups skipped and in the
dense FFN's two kernels, bf16 and FP8 E5M2 weights, from torch.profiler (kernel durations, no launch gaps).
tp: the graphed decode step. On one GPU: the whole model where it fits (TP=1, the step that TP divides) and rank 0's
shard of a --world split without communication (the floor: wrong numbers, the time communication adds to). Under
torchrun, per communication variant: none (the floor), NCCL, symmetric memory with each ticket scope and push launch.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os

import torch
import torch.distributed as dist
from llamafast.kernels import tp_sync
from llamafast.kernels.gemv import GemvConfig
from torch.profiler import ProfilerActivity, profile

from llamafast.config import Backend, DType, SamplingConfig, TPComm, model_config
from llamafast.errors import LlamafastError
from llamafast.generate import Engine
from llamafast.load import random_model
from llamafast.load.shard import Shard
from llamafast.measure.common import copy_bandwidth, environment, input_sets
from llamafast.measure.registry import REGISTRY
from llamafast.quant import FP8Format
from llamafast.tp.comm import make_comm
from llamafast.tp.dist import setup

CALLS = 20  # sparse: profiled calls per kernel set, cycling through the input sets


def kernel_us(fn, sets) -> dict[str, float]:
    """Microseconds per call of each CUDA kernel fn launches, over CALLS calls after one warm-up pass."""
    for args, kwargs in sets:
        fn(*args, **kwargs)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(CALLS):
            args, kwargs = sets[i % len(sets)]
            fn(*args, **kwargs)
        torch.cuda.synchronize()
    totals = collections.defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            totals[e.name] += e.device_time / CALLS  # device_time is microseconds
    return dict(totals)


def sparse(a) -> None:
    config, dtype, device = model_config(a.shape), torch.bfloat16, torch.device("cuda")
    report = []
    for fp8 in (None, FP8Format.e5m2):
        for name in ("sparse_ffn[router 0.5]", "sparse_ffn[gate 0.5]", "rmsnorm_swiglu", "linear_residual[w2]"):
            spec = REGISTRY[name]
            nbytes = spec.bytes_moved(config, dtype, 1, fp8)
            sets = input_sets(functools.partial(spec.make_inputs, config, dtype, device, 1, fp8), nbytes)
            times = kernel_us(spec.kernel, sets)
            report.append({"kernel": name, "fp8": fp8 and fp8.value, "kernels_us": times,
                           "total_us": sum(times.values()), "bytes": nbytes})
            del sets
            torch.cuda.empty_cache()
    with open(a.out, "w") as f:
        json.dump({"shape": a.shape, "calls": CALLS, "report": report}, f, indent=1)
    for r in report:
        parts = ", ".join(f"{k.split('(')[0][:28]} {v:.1f}" for k, v in r["kernels_us"].items())
        print(f"{r['kernel']:24} {r['fp8'] or 'bf16':5} {r['total_us']:6.1f} us "
              f"{r['bytes'] / r['total_us'] / 1e3:5.0f} GB/s | {parts}")


class NoComm:
    """Each rank's partial sums kept to itself: the arithmetic of a TP step without its communication."""

    name = TPComm.nccl

    def row_linear(self, ops, x, w, residual, slot):
        return ops.linear_residual(x, w, residual)

    def lm_head(self, ops, x, norm_w, w, eps, slot):
        return ops.rmsnorm_lm_head(x, norm_w, w, eps)


def step_ms(model, steps: int = 200) -> float:
    """Milliseconds per graphed decode step, after a 16-token prompt and 4 warm-up steps."""
    engine = Engine(model, SamplingConfig(temperature=0), 16 + steps + 8)
    engine.prefill(list(range(1, 17)))
    for _ in range(4):
        engine.decode()
    torch.cuda.synchronize()
    if dist.is_initialized():
        dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        engine.decode()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / steps


def _step(name: str, ms: float, show: bool = True) -> dict:
    if show:
        print(f"{name:36} {ms:7.3f} ms/token {1e3 / ms:7.1f} tok/s", flush=True)
    return {"variant": name, "ms_per_token": ms, "tok_s": 1e3 / ms}


def one_gpu_steps(shape: str, world: int, device: torch.device):
    """Rank 0's shard of a `world`-way split on this one GPU, and its steps: TP=1 (the whole model, where it fits)
    and the shard's floor. Returns (the shard's model, the steps)."""
    model = random_model(shape, device, DType.bfloat16, Backend.triton, shard=Shard(0, world)).model
    steps = []
    try:
        steps.append(_step("TP=1", step_ms(random_model(shape, device, DType.bfloat16, Backend.triton).model)))
    except LlamafastError as e:  # 70B: 138 GB
        print(f"TP=1: {e}")
    torch.cuda.empty_cache()
    model.comm = NoComm()
    steps.append(_step("none (floor)", step_ms(model)))
    return model, steps


def variants(ranks, model):
    config, sharded = model.config, model.shard.vocab_sharded(model.config)
    yield "none (floor)", NoComm(), {}
    yield "nccl", make_comm(TPComm.nccl, ranks, config, sharded, "graph")[0], {}
    symm = make_comm(TPComm.symm, ranks, config, sharded, "graph")[0]
    yield "symm sys-ticket", symm, {"ticket": "sys"}
    yield "symm gpu-ticket", symm, {"ticket": "gpu"}
    for bn, w in ((8, 4), (16, 4)):
        yield f"symm gpu-ticket push {bn}x1024/{w}w", symm, {"ticket": "gpu", "push": GemvConfig(bn, 1024, w)}


def tp(a) -> None:
    torchrun = "WORLD_SIZE" in os.environ
    if not torchrun:
        model, steps = one_gpu_steps(a.shape, a.world, torch.device("cuda"))
        world, device, leader = a.world, torch.device("cuda"), True
    else:
        ranks = setup(None)
        world, device, leader = ranks.shard.world, ranks.device, ranks.leader
        model = random_model(a.shape, device, DType.bfloat16, Backend.triton, shard=ranks.shard).model
        steps = []
        for name, comm, knobs in variants(ranks, model):
            tp_sync.TICKET_SCOPE = knobs.get("ticket", "sys")
            if "push" in knobs:
                ws = (model.layers[0].attention.wo.weight, model.layers[0].feed_forward.w2.weight)
                comm.push_configs = {(*w.shape, w.element_size()): knobs["push"] for w in ws}
            model.comm = comm
            steps.append(_step(name, step_ms(model), leader))
    if leader:
        with open(a.out, "w") as f:
            json.dump({"shape": a.shape, "world": world, "copy_bw_gb_s": copy_bandwidth(device),
                       "one_gpu": not torchrun, "environment": environment(device), "steps": steps}, f, indent=1)
    if torchrun:
        dist.barrier()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, run, summary in (("sparse", sparse, "the sparse and dense FFN kernel by kernel"),
                               ("tp", tp, "a tensor-parallel decode step: its floor, per communication variant")):
        cmd = sub.add_parser(name, help=summary)
        cmd.set_defaults(run=run)
        cmd.add_argument("--shape", default="llama-2-7b")
        cmd.add_argument("--out", required=True, help="the JSON report")
    sub.choices["tp"].add_argument("--world", type=int, default=2,
                                   help="without torchrun: the tensor-parallel size whose rank 0 is timed")
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
