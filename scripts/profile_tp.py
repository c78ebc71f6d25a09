"""What a tensor-parallel decode step's synchronisation costs: the graphed step per way of communicating, against
its floor (each rank's shard decoding with no communication at all: wrong numbers, the time communication adds
to), timed in the same call on the same GPUs. docs/tensor-parallel.md's per-point costs come from it, and a change
to the tensor-parallel step is weighed with it.

    torchrun --standalone --nproc-per-node 2 scripts/profile_tp.py --shape llama-2-7b --out OUT.json
    torchrun --standalone --nproc-per-node 2 scripts/profile_tp.py --shape llama-2-70b --sweep --out OUT.json
    python scripts/profile_tp.py --world 2 --shape llama-2-7b --out OUT.json   # one GPU: TP=1 and rank 0's floor
    python scripts/profile_tp.py --world 2 --backend persistent --out OUT.json  # the same, the one-kernel step

Under torchrun, per variant: none (the floor, timed on every rank at once: the spread between the ranks' floors is
their drift, which every wait exposes), NCCL all-reduces, and symmetric memory (kernels/tp_sync.py). Each variant's cost per synchronisation point is (its ms/token - the slowest
rank's floor) / points, points = 2 per layer + 1 for the logits. --backend persistent: every step in the
one-kernel decode step (kernels/decode_step_tp.py), whose synchronisation is symm's alone (no NCCL variant). --sweep: then the launches of the kernels that add
the ranks' partials under symm (RMSNorm + SwiGLU, + QKV, + LM head), which every program reads whole, so their
best launch is not the floor's: their committed entries under the key + ("summed",) come from it. --timeline: each
variant's step also taken apart by kernel (bench.timeline, rank 0's kernels from torch.profiler, each step replayed
alone), so a point's cost shows where it lands: in the producers, the consumers or the gaps between them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

import torch
import torch.distributed as dist

from llamafast.bench.timeline import record_steps, summarize
from llamafast.config import Backend, DType, SamplingConfig, TPComm
from llamafast.errors import LlamafastError
from llamafast.generate import Engine
from llamafast.kernels.gemv import GemvConfig, gemv_config, gemv_key
from llamafast.load import random_model
from llamafast.load.shard import Shard
from llamafast.measure.common import copy_bandwidth, environment
from llamafast.tuning.sweep import gemv_candidates
from llamafast.tp.comm import make_comm
from llamafast.tp.dist import setup


class NoComm:
    """Each rank's partial sums kept to itself: the arithmetic of a TP step without its communication (the
    persistent step runs it as one GPU's: model.forward takes no `in_step` for yes). vocab: the
    model's whole vocabulary, where a rank's LM head holds only its rows: its logits are copied into a buffer that
    long (the rest zeros), since the sampler takes the whole vocabulary (the fused one checks it)."""

    name = TPComm.nccl

    def __init__(self, vocab: int | None = None):
        self.vocab, self.logits = vocab, None

    def row_linear(self, ops, x, w, residual, slot):
        return ops.linear_residual(x, w, residual)

    def lm_head(self, ops, x, norm_w, w, eps, slot):
        local = ops.rmsnorm_lm_head(x, norm_w, w, eps)
        if self.vocab is None or local.shape[-1] == self.vocab:
            return local
        if self.logits is None or self.logits.shape[0] != local.shape[0]:  # made in the eager step before a capture
            self.logits = torch.zeros(local.shape[0], self.vocab, dtype=local.dtype, device=local.device)
        self.logits[:, : local.shape[-1]].copy_(local)
        return self.logits


def step_ms(model, steps: int = 200) -> float:
    """Milliseconds per graphed decode step, after a 16-token prompt and 4 warm-up steps."""
    return timed_step(model, steps)[0]


def timed_step(model, steps: int = 200, timeline: bool = False) -> tuple[float, dict | None]:
    """step_ms, and with timeline 20 more steps taken apart by kernel (every rank replays them, in step)."""
    engine = Engine(model, SamplingConfig(temperature=0), 16 + steps + (40 if timeline else 8))
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
    if not timeline:
        return start.elapsed_time(end) / steps, None
    if dist.is_initialized():
        dist.barrier()
    # Times only: no op's bytes are counted, so no copy bandwidth is measured (a 2 GiB copy beside a 70B shard).
    t = summarize(record_steps(engine, 20), lambda op: 0, 0.0).to_dict()
    t["ops"] = [{k: r[k] for k in ("op", "segment", "calls", "us", "gap_us")} for r in t["ops"]]
    return start.elapsed_time(end) / steps, {k: t[k] for k in ("span_us", "kernel_us", "gap_us", "layer_us", "ops")}


def show_timeline(name: str, t: dict) -> None:
    print(f"  {name}: span {t['span_us']:.1f} us = kernels {t['kernel_us']:.1f} + gaps {t['gap_us']:.1f}; "
          f"middle layer {t['layer_us']:.2f} us", flush=True)
    for r in t["ops"]:
        print(f"    {r['segment']:8} {r['op']:28} x{r['calls']:<3} {r['us']:8.2f} us  gap {r['gap_us']:6.2f} us",
              flush=True)


def _step(name: str, ms: float, show: bool = True, timeline: dict | None = None, **extra) -> dict:
    if show:
        print(f"{name:28} {ms:7.3f} ms/token {1e3 / ms:7.1f} tok/s"
              + "".join(f"  {k} {v:.2f}" for k, v in extra.items() if isinstance(v, float)), flush=True)
        if timeline:
            show_timeline(name, timeline)
    return {"variant": name, "ms_per_token": ms, "tok_s": 1e3 / ms, **extra, **({"timeline": timeline} if timeline
                                                                             else {})}


def floor_model(shape: str, world: int, device: torch.device, backend: Backend = Backend.triton):
    """Rank 0's shard of a `world`-way split on this one GPU, decoding with no communication (its floor)."""
    model = random_model(shape, device, DType.bfloat16, backend, shard=Shard(0, world)).model
    model.comm = NoComm(model.config.vocab_size)
    return model


def one_gpu_steps(shape: str, world: int, device: torch.device, timeline: bool = False,
                  backend: Backend = Backend.triton):
    """Rank 0's shard of a `world`-way split on this one GPU, and its steps: TP=1 (the whole model, where it fits)
    and the shard's floor. Returns (the shard's model, the steps)."""
    model = floor_model(shape, world, device, backend)
    steps = []
    try:
        whole = random_model(shape, device, DType.bfloat16, backend).model
        ms, t = timed_step(whole, timeline=timeline)
        steps.append(_step("TP=1", ms, timeline=t))
        del whole
    except LlamafastError as e:  # 70B: 138 GB
        print(f"TP=1: {e}")
    torch.cuda.empty_cache()
    ms, t = timed_step(model, timeline=timeline)
    steps.append(_step("none (floor)", ms, timeline=t))
    return model, steps


def variants(ranks, model):
    """(name, comm) per variant, the floor first (the persistent step: symm alone)."""
    config, sharded = model.config, model.shard.vocab_sharded(model.config)
    yield "none (floor)", NoComm(model.config.vocab_size)
    persistent = model.backend.layers is not None
    for comm in (TPComm.symm,) if persistent else (TPComm.nccl, TPComm.symm):
        yield comm.value, make_comm(comm, ranks, config, sharded, "graph")[0]


def consumer_weights(model) -> dict:
    """The kernels that add the ranks' partials in symm's decode, by table, each with its weight at the shard's
    shape; the one with the most programs first."""
    layer = model.layers[0]
    return {"rmsnorm_swiglu": layer.feed_forward.w1.weight, "rmsnorm_qkv_rope": layer.attention.wqkv.weight,
            "rmsnorm_lm_head": model.output.weight}


def scaled(cfg: GemvConfig, pair: bool, fp8: bool) -> list[GemvConfig]:
    """cfg itself and cfg with 1/2, 2 or 4 times its rows and warps per program (at most 8 warps), those of the
    decode GEMVs' launch grid (tuning.sweep.gemv_candidates: no fp32 tile that spills)."""
    grid, out = gemv_candidates(pair, fp8), []
    for num, den in ((1, 2), (1, 1), (2, 1), (4, 1)):
        warps = max(1, min(8, cfg.num_warps * num // den))
        new = dataclasses.replace(cfg, block_n=cfg.block_n * num // den, num_warps=warps)
        if (new == cfg or new in grid) and new not in out:
            out.append(new)
    return out


def sweep_consumers(model, timed) -> tuple[list[dict], dict]:
    """Each consumer's launch under symm (the table key + ("summed",)), one kernel at a time, the others at their
    best so far: every candidate of `scaled` timed over the whole graphed step. Returns (rows, winners)."""
    rows, winners = [], {}
    for table, w in consumer_weights(model).items():
        launches, key = model.backend.launches[table], (*gemv_key(w), "summed")
        best = None
        for cfg in scaled(gemv_config(launches, w, summed=True), table == "rmsnorm_swiglu", key[2] == 1):
            launches[key] = cfg
            ms = timed()
            rows.append({"kernel": table, "key": list(key), "config": dataclasses.asdict(cfg), "ms_per_token": ms})
            if best is None or ms < best[0]:
                best = (ms, cfg)
        launches[key] = best[1]
        winners[table] = {"key": list(key), "config": dataclasses.asdict(best[1]), "ms_per_token": best[0]}
    return rows, winners


def under_torchrun(shape: str, sweep: bool, timeline: bool = False, backend: Backend = Backend.triton):
    """Every variant on every rank; returns (ranks, the leader's rows)."""
    ranks = setup(None)
    model = random_model(shape, ranks.device, DType.bfloat16, backend, shard=ranks.shard).model
    points = 2 * model.config.n_layers + 1
    steps, floor = [], None

    def timed(comm, kernels: bool = False):
        """ms/token on this rank, every rank's, and (kernels) this rank's step by kernel."""
        model.comm = comm
        ms, t = timed_step(model, timeline=kernels)
        every = [None] * ranks.shard.world
        dist.all_gather_object(every, ms, group=ranks.control)
        return ms, every, t

    for name, comm in variants(ranks, model):
        ms, every, t = timed(comm, timeline)
        if floor is None:  # the floor: every rank's, and their spread
            floor = max(every)
            steps.append(_step(name, ms, ranks.leader, t, slowest_rank_ms=floor, drift_us_per_point=1e3 * (
                floor - min(every)) / points))
        else:
            steps.append(_step(name, ms, ranks.leader, t, us_per_point=1e3 * (ms - floor) / points))
    if sweep:
        config, sharded = model.config, model.shard.vocab_sharded(model.config)
        comm = make_comm(TPComm.symm, ranks, config, sharded, "graph")[0]

        def symm_ms():
            return max(timed(comm)[1])

        rows, winners = sweep_consumers(model, symm_ms)
        for r in rows if ranks.leader else ():
            print(f"  {r['kernel']:18} {r['config']}: {r['ms_per_token']:.3f} ms/token", flush=True)
        ms = timed(comm)[0]
        steps.append(_step("symm, swept consumers", ms, ranks.leader, None, us_per_point=1e3 * (ms - floor) / points,
                           sweep=rows, winners=winners))
    return ranks, steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="llama-2-7b")
    parser.add_argument("--out", required=True, help="the JSON report")
    parser.add_argument("--world", type=int, default=2, help="without torchrun: the tensor-parallel size whose rank 0 is timed")
    parser.add_argument("--sweep", action="store_true", help="under torchrun: then sweep the launches of symm's "
                        "consumers (consumer_weights) and time symm with the winners")
    parser.add_argument("--timeline", action="store_true", help="take each variant's step apart by kernel (rank 0's)")
    parser.add_argument("--backend", type=Backend, default=Backend.triton, choices=[Backend.triton, Backend.persistent],
                        help="triton (the per-op graph) or persistent (the one-kernel step)")
    a = parser.parse_args()
    torchrun = "WORLD_SIZE" in os.environ
    if torchrun:
        ranks, steps = under_torchrun(a.shape, a.sweep, a.timeline, a.backend)
        world, device, leader = ranks.shard.world, ranks.device, ranks.leader
    else:
        steps = one_gpu_steps(a.shape, a.world, torch.device("cuda"), a.timeline, a.backend)[1]
        world, device, leader = a.world, torch.device("cuda"), True
    if leader:
        with open(a.out, "w") as f:
            json.dump({"shape": a.shape, "world": world, "backend": a.backend.value, "copy_bw_gb_s": copy_bandwidth(device),
                       "one_gpu": not torchrun, "environment": environment(device), "steps": steps}, f, indent=1)
    if torchrun:
        dist.barrier()


if __name__ == "__main__":
    main()
