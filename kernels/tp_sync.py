"""Tensor parallel without an all-reduce kernel: row-parallel projections push their partial sums into every
rank's symmetric-memory buffer, and the next fused kernel adds them while it reads its input.

Under Megatron sharding (attention by heads, the FFN by neurons) wo and w2 each leave a partial (C,) sum on
every rank. Here the projection that makes it (push_linear, or the LM head with push=) stores its rows straight
into each peer's buffer over NVLink (C x 4 bytes per peer per sync), and the program that finishes last on a
rank raises a flag on every rank. The consumer, rmsnorm_qkv_rope / rmsnorm_swiglu / rmsnorm_lm_head given a
SummedInput, reads its first weight tile, waits for N arrivals (gemv.dot_rows, counters.wait_arrivals), sums
residual + the N partials in rank order while streaming its weights (gemv_tiles.add_parts), stores that sum for
the next residual, and its last program resets the flag in the graph.
Pushing rather than pulling: every consumer program needs the whole input vector, so pulling it from the peers
would cross NVLink once per program (hundreds of times per sync) instead of once.

Decode has 2 synchronisation points per layer (after wo, after w2) and one for the vocabulary-sharded logits.
Buffers and flags are per (layer, op) slot, so a slot is only rewritten in the next decode step, after every
rank has passed the slot's consumer: rank r reaches step t+1's layer 0 only once every peer finished step t.

Measured per synchronisation point over the step with no communication at all (scripts/profile_tp.py). On 2
H100s (NV18), Llama-2-7B / 13B / 70B: NCCL's all-reduce 9.9 / 11.1 / 9.3 us; this signalling, the consumers with
launches of their own (gemv_config's "summed" key) 6.0 / -2.0 / 7.4 us (scripts/results/tp/h100x2_1e915b5; 13B's
floor runs the floor's slower launches), and with the floor's launches 8.9 / 1.9 / 15.2 us (h100x2_4ff06c3);
the last producer fencing with an acq_rel atomic and releasing each flag (three MEMBAR.SYS in a row) 11.1 / 4.3 /
17.7 us; consumers that wait for the flag alone, not also for the producer's grid (skipping PDL's
griddepcontrol.wait), 8.6 / 2.2 / 15.9 us: 0.3 us won at 7B, 0.3 and 0.7 lost at 13B and 70B, so they wait for
both. Earlier, on 2 H200s (h200x2_flags, h200x2_tagged, h200x2_variants), 7B /
13B: the consumer polling with acquire loads and launched with PDL (its first weight tile read before the waits)
9.5 / 0.8 us, the same without PDL 8.2 / 3.3 us, so PDL is kept, as on one GPU. Every push program releasing its
own arrival on every rank (no ticket) 14.3 / 8.8 us; every program's ticket at system scope 8.6 / 4.8 us; wider
push launches (8 or 16 rows x 1024, 4 warps) 9.4 and 14.0 us at 7B. Values tagged with the step in one 8-byte word
each (NCCL's LL protocol: no ticket, no flag), which every consumer program polled slice by slice, cost 16.4 us at
7B (it doubles the bytes every program reads and adds a block reduction per slice to test the tags); each thread
spinning on its own tagged words, with no block-wide test, 24.9-25.8 us at 7B and 15.3-23.2 at 13B on 2 H200s, and
with the words loaded and stored 16 bytes at a time 10.9 / 14.5 us against these flags' 6.0 / 10.9 in the same call
(scripts/experiments/tagged_words). Where a point goes on 2 H200s (scripts/experiments/sync_parts.py): of 7B's
6.4 us, 3.0 are the producers' tickets and the last one's system-scope fence and flag atomics, which hold the
producer's grid open for every consumer's grid wait, 0.8 crossing NVLink and 0.4 waiting for the peers (13B: 4.3,
0.7, 1.5 of 10.9).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from llamafast.config import Weight

from ._common import cdiv, check_rows, check_vector, scale_arg
from .counters import fence_sys, wait_arrivals
from .gemv import GemvConfig, dot_rows, gemv_config, launch_args
from .linear_residual import CONFIGS as LINEAR_CONFIGS

CONFIGS: dict[tuple[int, int, int], GemvConfig] = {}  # (N, K, bytes) -> launch; linear_residual's shapes otherwise


@dataclass(frozen=True)
class Peers:
    """One rank's view of the symmetric buffers: int64 tables of every rank's base addresses (device tensors) and
    this rank's own tensors. parts (slots, N, C) fp32; flags (slots, 2) int32 [arrivals, consumer ticket]; counters
    (slots,) int32, local, the producers' tickets."""

    rank: int
    world: int
    parts_table: torch.Tensor  # (N,) int64: each rank's parts base
    flags_table: torch.Tensor  # (N,) int64: each rank's flags base
    parts: torch.Tensor
    flags: torch.Tensor
    counters: torch.Tensor
    logits_table: torch.Tensor | None = None  # (N,) int64: each rank's (V,) fp32 logits, vocabulary sharded
    logits: torch.Tensor | None = None


@dataclass(frozen=True)
class SummedInput:
    """A decode input still spread over the ranks: residual + sum of parts (N, C) fp32, complete once flag
    (2,) int32 counts N arrivals. The consuming kernel stores the sum into `summed` (1, C), the next residual."""

    residual: torch.Tensor
    parts: torch.Tensor
    flag: torch.Tensor
    summed: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return self.residual.shape


def consumer_args(x) -> tuple[torch.Tensor, dict]:
    """(the tensor to check shapes against, the kernel arguments that make a consumer add the parts)."""
    if not hasattr(x, "summed"):  # duck-typed: kernels/ is importable as llamafast.kernels and as kernels
        return x, {}
    return x.residual, {"p_ptr": x.parts, "xo_ptr": x.summed, "f_ptr": x.flag, "PARTS": x.parts.shape[0]}


@triton.jit
def release_slot(f_ptr, n):
    """The consumer's last of n programs (or tasks, in the persistent step) resets the flag for the next step (every one
    has read the parts). The tickets are relaxed: a program takes one only after its poll saw the flag up (a control
    dependency), so no program still polls when the flag drops, and nothing writes the parts or the flag again before
    this kernel has ended and a later producer has fenced. An acq_rel ticket is a MEMBAR.GPU in every program, behind
    its own output stores: relaxed, a point cost 0.45 us less at 7B and 0.4 at 13B on two H200s (5.95 against 6.40,
    10.52 against 10.91; scripts/results/tp/h200x2_sync_parts/)."""
    tl.debug_barrier()
    ticket = tl.atomic_add(f_ptr + 1, 1, sem="relaxed", scope="gpu")
    if ticket == n - 1:
        tl.atomic_xchg(f_ptr + 1, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(f_ptr, 0, sem="relaxed", scope="gpu")


@triton.jit
def push_rows(values, rows, mask, table_ptr, offset, WORLD: tl.constexpr):
    """Stores fp32 values at rows + offset of every rank's buffer (table_ptr: their base addresses)."""
    for r in tl.static_range(WORLD):
        base = tl.load(table_ptr + r).to(tl.pointer_type(tl.float32))
        tl.store(base + offset + rows, values, mask=mask)


@triton.jit
def signal_peers(counter_ptr, flags_table, flag_offset, n, WORLD: tl.constexpr):
    """After this program's pushes: the rank's last of n programs (or tasks, in the persistent step) raises the slot's
    flag on every rank. Each program takes an acq_rel ticket at GPU scope (its stores ordered before it); the last one
    fences once at system scope, which makes every program's remote stores visible, then increments the flags relaxed
    (PTX's release pattern: a fence, then a strong write). Each release increment would be a MEMBAR.SYS of its own:
    three in a row with an acq_rel atomic as the fence cost 2.2 (7B), 2.4 (13B) and 2.5 us (70B) more per
    synchronisation point."""
    tl.debug_barrier()
    ticket = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
    if ticket == n - 1:
        fence_sys(ticket)
        tl.atomic_xchg(counter_ptr, 0, sem="relaxed", scope="gpu")
        for r in tl.static_range(WORLD):
            flags = tl.load(flags_table + r).to(tl.pointer_type(tl.int32))
            tl.atomic_add(flags + flag_offset, 1, sem="relaxed", scope="sys")


@triton.jit
def _push_linear_kernel(
    x_ptr, w_ptr, s_ptr, table_ptr, flags_table, counter_ptr,  # x (K,), W (N, K), E4M3 scales (N,)
    N, K, stride_wn, offset, flag_offset,  # rows go to offset + row in each rank's parts buffer
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, W_FP8: tl.constexpr, WORLD: tl.constexpr,
    PDL: tl.constexpr = False,
):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = rows < N
    acc, _, _ = dot_rows(
        w_ptr, w_ptr, s_ptr, s_ptr, x_ptr, x_ptr, rows, mask, K, stride_wn, BLOCK_N, BLOCK_K, False, False, EVEN_K, W_FP8,
        PDL=PDL,
    )
    push_rows(acc, rows, mask, table_ptr, offset, WORLD)
    signal_peers(counter_ptr, flags_table, flag_offset, tl.num_programs(0), WORLD)


@triton.jit
def _wait_kernel(f_ptr, n):
    wait_arrivals(f_ptr, n)
    release_slot(f_ptr, tl.num_programs(0))


def push_linear(x: torch.Tensor, w: Weight, peers: Peers, slot: int, residual, configs=None) -> SummedInput:
    """This rank's x (1, K) @ w.T (w (C, K), this rank's columns of a row-parallel weight) pushed into row `rank`
    of parts[slot] on every rank; returns the input of the next fused kernel: residual + the sum over ranks."""
    n, k = w.shape
    check_vector("x", x, k)
    check_rows("w", w.data, k)
    check_vector("residual", residual, n)
    cfg = gemv_config(configs or CONFIGS or LINEAR_CONFIGS, w.data)
    c = peers.parts.shape[-1]
    _push_linear_kernel[(cdiv(n, cfg.block_n),)](
        x, w.data, scale_arg(w), peers.parts_table, peers.flags_table, peers.counters[slot:],
        n, k, w.data.stride(0), (slot * peers.world + peers.rank) * c, slot * 2,
        WORLD=peers.world, **launch_args(cfg, w, pdl=True),
    )
    return SummedInput(residual, peers.parts[slot], peers.flags[slot], torch.empty_like(residual))


def wait_logits(peers: Peers, slot: int) -> torch.Tensor:
    """Waits for every rank's logits shard (pushed by rmsnorm_lm_head) and returns the whole (1, V) row."""
    _wait_kernel[(1,)](peers.flags[slot], peers.world)
    return peers.logits.view(1, -1)
