"""Where a tensor-parallel decode step's time goes, on 2 GPUs: the whole graphed step per communication variant
(no communication at all, the compute floor with wrong results; NCCL; symmetric memory with its knobs), and
the launch sweep for the kernels at this rank's shard shapes (rank 0; the winners go into the CONFIGS tables).

    torchrun --standalone --nproc-per-node 2 scripts/profile_tp.py --shape llama-2-7b --out OUT.json [--tune]
    python scripts/profile_tp.py --world 2 ...   (one GPU: rank 0's shard without communication, and TP=1)
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os

import torch
import torch.distributed as dist

from llamafast.measure.common import copy_bandwidth, environment, input_sets, time_in_graph
from llamafast.config import Backend, DType, SamplingConfig, TPComm
from llamafast.errors import LlamafastError
from llamafast.generate import Engine
from llamafast.kernels import tp_sync
from llamafast.kernels.gemv import GemvConfig
from llamafast.load import random_model
from llamafast.tp.comm import make_comm
from llamafast.tp.dist import setup
from llamafast.load.shard import Shard


class NoComm:
    """Each rank's partial sums kept to itself: the arithmetic of a TP step without its communication."""

    name = TPComm.nccl

    def row_linear(self, ops, x, w, residual, scale, fmt, slot):
        return ops.linear_residual(x, w, residual, scale, fmt=fmt)

    def lm_head(self, ops, x, norm_w, w, eps, scale, fmt, slot):
        return ops.rmsnorm_lm_head(x, norm_w, w, eps, scale, fmt=fmt)


def step_ms(model, steps: int = 200) -> float:
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


def variants(ranks, model):
    config, sharded = model.config, model.shard.vocab_sharded(model.config)
    yield "none (floor)", NoComm(), {}
    yield "nccl", make_comm(TPComm.nccl, ranks, config, sharded, "graph")[0], {}
    symm = make_comm(TPComm.symm, ranks, config, sharded, "graph")[0]
    yield "symm sys-ticket", symm, {"ticket": "sys"}
    yield "symm gpu-ticket", symm, {"ticket": "gpu"}
    for bn, w in ((8, 4), (16, 4)):
        yield f"symm gpu-ticket push {bn}x1024/{w}w", symm, {"ticket": "gpu", "push": GemvConfig(bn, 1024, w)}


def tune(model, copy_bw) -> list[dict]:
    """Launch sweep of each decode GEMV at this rank's shard shapes (time_in_graph, 256 MB of inputs)."""
    from llamafast.kernels import linear_residual, rmsnorm_lm_head, rmsnorm_qkv_rope, rmsnorm_swiglu

    layer, dev, dt = model.layers[0], "cuda", torch.bfloat16
    c = model.config.dim
    cache = layer.k_cache
    rows = []

    def vec(n):
        return torch.randn(1, n, device=dev, dtype=dt)

    jobs = {
        "rmsnorm_qkv_rope": (rmsnorm_qkv_rope, layer.attention.wqkv.weight,
                             lambda w: ((vec(c), torch.ones(c, device=dev, dtype=dt), w, model.rope_cos, model.rope_sin,
                                         torch.tensor(3, device=dev), torch.zeros_like(cache), torch.zeros_like(cache),
                                         1e-5), {})),
        "linear_residual[wo]": (linear_residual, layer.attention.wo.weight, lambda w: ((vec(w.shape[1]), w, vec(c)), {})),
        "rmsnorm_swiglu": (rmsnorm_swiglu, layer.feed_forward.w1.weight,
                           lambda w: ((vec(c), torch.ones(c, device=dev, dtype=dt), w, torch.randn_like(w), 1e-5), {})),
        "linear_residual[w2]": (linear_residual, layer.feed_forward.w2.weight, lambda w: ((vec(w.shape[1]), w, vec(c)), {})),
        "rmsnorm_lm_head": (rmsnorm_lm_head, model.output.weight,
                            lambda w: ((vec(c), torch.ones(c, device=dev, dtype=dt), w, 1e-5), {})),
    }
    for name, (fn, w, make) in jobs.items():
        pair = name == "rmsnorm_swiglu"
        nbytes = w.nbytes * (2 if pair else 1)
        sets = input_sets(lambda: make(torch.randn_like(w)), nbytes)
        key = (*w.shape, w.element_size())
        for bn, bk, warps in itertools.product([2, 4, 8, 16], [256, 512, 1024], [1, 2, 4, 8]):
            per_thread = bn * bk * (2 if pair else 1) / (32 * warps)
            if not (8 <= per_thread <= 64 and bk * bn >= 8 * 32 * warps):
                continue
            cfg = GemvConfig(bn, bk, warps)
            try:
                us = time_in_graph(functools.partial(fn, configs={key: cfg}), sets, replays=10)
            except Exception:  # a config the compiler rejects
                continue
            rows.append({"kernel": name, "shape": list(key), "config": cfg.__dict__, "us": us,
                         "fraction": nbytes / us / 1e3 / copy_bw})
        del sets
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="llama-2-7b")
    parser.add_argument("--out", required=True)
    parser.add_argument("--tune", action="store_true")
    parser.add_argument("--world", type=int, default=2, help="without torchrun: the world whose rank 0 is timed")
    args = parser.parse_args()
    torchrun = "WORLD_SIZE" in os.environ
    ranks = setup(None) if torchrun else None
    shard, device = (ranks.shard, ranks.device) if torchrun else (Shard(0, args.world), torch.device("cuda"))
    leader = not torchrun or ranks.leader
    lm = random_model(args.shape, device, DType.bfloat16, Backend.triton, shard=shard)
    model = lm.model
    copy_bw = copy_bandwidth(device)
    results = []
    if not torchrun:  # the whole model on this GPU too, where it fits: the step that TP divides
        try:
            ms = step_ms(random_model(args.shape, device, DType.bfloat16, Backend.triton).model)
            results.append({"variant": "TP=1", "ms_per_token": ms, "tok_s": 1e3 / ms})
            print(f"{'TP=1 (whole model)':36} {ms:7.3f} ms/token {1e3 / ms:7.1f} tok/s", flush=True)
        except LlamafastError as e:
            print(f"TP=1: {e}")
        torch.cuda.empty_cache()
    for name, comm, knobs in variants(ranks, model) if torchrun else [("none (floor)", NoComm(), {})]:
        tp_sync.TICKET_SCOPE = knobs.get("ticket", "sys")
        tp_sync.CONFIGS.clear()
        if "push" in knobs:
            for w in (model.layers[0].attention.wo.weight, model.layers[0].feed_forward.w2.weight):
                tp_sync.CONFIGS[(*w.shape, w.element_size())] = knobs["push"]
        model.comm = comm
        ms = step_ms(model)
        results.append({"variant": name, "ms_per_token": ms, "tok_s": 1e3 / ms})
        if leader:
            print(f"{name:36} {ms:7.3f} ms/token {1e3 / ms:7.1f} tok/s", flush=True)
    tuned = tune(model, copy_bw) if args.tune and leader else []
    if leader:
        for kernel, group in itertools.groupby(tuned, key=lambda r: r["kernel"]):
            best = sorted(group, key=lambda r: r["us"])[:2]
            for r in best:
                print(f"{kernel:22} {r['shape']} {r['us']:7.1f} us {100 * r['fraction']:5.1f}%  {r['config']}")
        with open(args.out, "w") as f:
            json.dump({"shape": args.shape, "world": shard.world, "copy_bw_gb_s": copy_bw, "one_gpu": not torchrun,
                       "environment": environment(device), "steps": results, "tune": tuned}, f, indent=1)
    if torchrun:
        dist.barrier()


if __name__ == "__main__":
    main()
