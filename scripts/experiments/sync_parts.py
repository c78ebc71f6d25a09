"""Where a symm synchronisation point's time goes: the graphed TP decode step with parts of the signalling taken
away, each beside its floor in the same process (wrong numbers: the time each part adds to).

    floor   each rank's shard with no communication (profile_tp.NoComm)
    symm    the committed path (kernels/tp_sync.py)
    local   symm with every rank's address tables pointing at its own buffers: the same kernels, tickets, fence,
            flag atomics, polls and partial reads, but nothing crosses NVLink and no rank waits for a peer
--patch, each taking a part away in both symm and local (set before any kernel compiles: Triton reads a jit
function's globals when it first compiles it):
    nowait            the consumers (and the logits' wait) skip the flag poll: what waiting for the flags exposes
    no_parts          the consumers read x alone, not the ranks' partials
    no_signal         the producers take no ticket and raise no flag (with nowait only, else the consumers hang)
    bf16_parts        the producers push their partials rounded to bf16, not fp32: half the bytes that every
                      consumer program reads (the NCCL path sums bf16 partials too)
At 3d19f66 it also had relaxed_release (the consumers' tickets relaxed, committed since: tp_sync.release_slot) and
relaxed_tickets (the producers' tickets relaxed: wrong order, the timing of a ticket without its fence).

cost per point = (ms/token - floor) / points, as in profile_tp.py. Under torchrun, from the repository root:

    torchrun --standalone --nproc-per-node 2 scripts/experiments/sync_parts.py --shape llama-2-7b [--patch nowait ...]
"""
import argparse
import dataclasses
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from profile_tp import NoComm, timed_step  # noqa: E402

from llamafast.config import Backend, DType, TPComm  # noqa: E402
from llamafast.load import random_model  # noqa: E402
from llamafast.tp.comm import make_comm, symmetric_tensor  # noqa: E402
from llamafast.tp.dist import setup  # noqa: E402


@triton.jit
def _no_wait(flag_ptr, n):
    tl.debug_barrier()


@triton.jit
def _no_signal(counter_ptr, flags_table, flag_offset, WORLD: tl.constexpr):
    tl.debug_barrier()


@triton.jit
def _no_parts(x, p_ptr, xo_ptr, k, K, EVEN_K: tl.constexpr, PARTS: tl.constexpr):
    x = x.to(xo_ptr.dtype.element_ty)
    tl.store(xo_ptr + k, x, mask=(k < K) & (tl.program_id(0) == 0))
    return x.to(tl.float32)


@triton.jit
def _push_rows_bf16(values, rows, mask, table_ptr, offset, WORLD: tl.constexpr):
    for r in tl.static_range(WORLD):
        base = tl.load(table_ptr + r).to(tl.pointer_type(tl.bfloat16))
        tl.store(base + offset + rows, values.to(tl.bfloat16), mask=mask)


def bf16_parts(ranks, comm):
    """comm with its partials' buffers in bf16 (with the bf16_parts patch)."""
    p = comm.peers
    parts, table = symmetric_tensor(ranks, tuple(p.parts.shape), torch.bfloat16)
    comm.peers = dataclasses.replace(p, parts=parts, parts_table=table)
    return comm


def patch(names: list[str]) -> None:
    import importlib

    gemv, gemv_tiles, rmsnorm_lm_head, tp_sync = (importlib.import_module(f"llamafast.kernels.{m}")
                                                  for m in ("gemv", "gemv_tiles", "rmsnorm_lm_head", "tp_sync"))
    where = {"nowait": ((gemv, tp_sync), "wait_arrivals", _no_wait),
             "no_parts": ((gemv_tiles,), "add_parts", _no_parts),
             "no_signal": ((tp_sync, rmsnorm_lm_head), "signal_peers", _no_signal),
             "bf16_parts": ((tp_sync,), "push_rows", _push_rows_bf16)}  # the logits stay fp32
    assert "no_signal" not in names or "nowait" in names, "without a signal every wait hangs"
    for name in names:
        modules, attr, fn = where[name]
        for m in modules:
            assert hasattr(m, attr), (m, attr)
            setattr(m, attr, fn)


def local_only(comm):
    """comm with its peers' address tables pointing at this rank's own buffers."""
    p = comm.peers

    def own(table):
        return None if table is None else torch.full_like(table, int(table[p.rank]))

    comm.peers = dataclasses.replace(p, parts_table=own(p.parts_table), flags_table=own(p.flags_table),
                                     logits_table=own(p.logits_table))
    return comm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="llama-2-7b")
    parser.add_argument("--patch", nargs="*", default=[], choices=["nowait", "no_parts", "no_signal", "bf16_parts"])
    parser.add_argument("--repeat", type=int, default=2)
    a = parser.parse_args()
    patch(a.patch)
    ranks = setup(None)
    model = random_model(a.shape, ranks.device, DType.bfloat16, Backend.triton, shard=ranks.shard).model
    points = 2 * model.config.n_layers + 1
    config, sharded = model.config, model.shard.vocab_sharded(model.config)
    comms = [make_comm(TPComm.symm, ranks, config, sharded, "graph")[0] for _ in range(2)]
    if "bf16_parts" in a.patch:
        comms = [bf16_parts(ranks, c) for c in comms]
    symm, local = comms[0], local_only(comms[1])
    tag = f" ({'+'.join(a.patch)})" if a.patch else ""
    floor = None
    for rep in range(a.repeat):
        for name, comm in (("floor", NoComm()), ("symm" + tag, symm), ("local" + tag, local)):
            model.comm = comm
            ms = timed_step(model)[0]
            every = [None] * ranks.shard.world
            dist.all_gather_object(every, ms, group=ranks.control)
            if name == "floor":
                floor = max(every)
            if ranks.leader:
                ranks_ms = " ".join(f"{m:.4f}" for m in every)
                print(f"{a.shape} rep {rep} {name:40} {max(every):.4f} ms/token (ranks {ranks_ms}), "
                      f"{1e3 * (max(every) - floor) / points:6.2f} us/point", flush=True)
    dist.barrier()


if __name__ == "__main__":
    main()
