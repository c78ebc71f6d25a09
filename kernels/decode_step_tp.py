"""A tensor-parallel rank's persistent decode step (decode_step.py with peers): its synchronisation points are
waits on the peers' flags inside the kernel, the mechanism of the per-op kernels (tp_sync.py) as tasks.

    wo, w2 tasks:  this rank's rows of the partial sum pushed into every rank's parts[slot][rank]; the op's last
                   task (a ticket) fences at system scope and raises slot's flag on every rank (signal_peers)
    qkv, gate/up:  each task reads its first weight tile, waits for the flag to count WORLD arrivals (an acquire
                   at system scope, which also orders this rank's own producers before it), and sums the residual
                   and the parts in rank order as it reads x; task i of the op stores the elements k % T == i of
                   that sum (the next residual), and the op's last task (a ticket) lowers the flag for the next step

Slots are per-op's (2 * layer for wo, 2 * layer + 1 for w2), so every rank must run the step or every rank the
per-op kernels. The last w2's parts are summed by the LM head, a per-op kernel (tp_sync.SummedInput). A slot is
written again only in the next decode step, after every rank has passed its consumer: the logits' exchange
(wait_logits) orders the steps. Layer 0's qkv reads x with zero parts, so every qkv task compiles one body.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .gemv import dot_rows
from .tp_sync import Peers, SummedInput, push_rows, signal_peers


@triton.jit
def push_task(tile, x_ptr, w_ptr, s_ptr, N, K, S: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
              FMT: tl.constexpr, wait_ptr, wait_target, watchdog_ptr, WAIT: tl.constexpr, STAGES: tl.constexpr,
              pt_ptr, ft_ptr, tk_ptr, slot, rank, WORLD: tl.constexpr, TASKS: tl.constexpr):
    """A row-parallel projection's tile: x @ W[rows].T pushed into parts[slot][rank] of every rank; the op's
    last task (of TASKS) raises the slot's flag on every rank."""
    rows = tile * BN + tl.arange(0, BN)
    mask = rows < N
    acc, _, _ = dot_rows(w_ptr, w_ptr, s_ptr, s_ptr, x_ptr, x_ptr, rows, mask, K, S, BN, BK, False, False,
                         K % BK == 0, FMT, wait_ptr=wait_ptr, wait_target=wait_target, watchdog_ptr=watchdog_ptr,
                         WAIT=WAIT, PREFETCH=STAGES)
    push_rows(acc, rows, mask, pt_ptr, (slot * WORLD + rank) * N, WORLD)
    signal_peers(tk_ptr + slot, ft_ptr, slot * 2, TASKS, WORLD)


@triton.jit
def summed_input(layer, op, x_in, x_ptr, xs_ptr, hs_ptr, dep_ptr, target, pp_ptr, pf_ptr, z_ptr, XR: tl.constexpr,
                 C: tl.constexpr, WORLD: tl.constexpr):
    """For a consumer op (0: qkv, 3: gate and up) of `layer`: (its residual, the ranks' parts, the flag it waits
    on, the wait's target, the slot; -1: none). qkv's residual is the layer before's h (layer 0: x, with zero
    parts and no wait), gate and up's the layer's x, which qkv's tasks stored. Other ops keep theirs."""
    consumes = (op == 0) | (op == 3)
    slot = tl.where(consumes, tl.where(op == 0, 2 * layer - 1, 2 * layer), -1)
    parts = pp_ptr + tl.maximum(slot, 0) * (WORLD * C)
    if slot < 0:
        parts = z_ptr
    if consumes:
        dep_ptr = pf_ptr + tl.maximum(slot, 0) * 2
        target = tl.where(target > 0, WORLD, 0)
        x_in = xs_ptr + layer * XR
        if op == 0:
            x_in = x_ptr if layer == 0 else hs_ptr + (layer - 1) * XR
    return x_in, parts, dep_ptr, target, slot


class StepPeers:
    """The step's view of a rank's Peers (tp_sync.py): the kernel's arguments, and the LM head's input."""

    def __init__(self, peers: Peers | None, n_layers: int, c: int, dtype: torch.dtype, device: torch.device):
        self.peers = peers
        if peers is None:  # one GPU: the kernel compiles no tensor-parallel code, these are placeholders
            dummy = torch.zeros(1, device=device, dtype=torch.int64)
            self.args, self.world = (dummy,) * 6 + (0,), 0
            return
        assert peers.parts.shape[0] >= 2 * n_layers and peers.parts.shape[-1] == c, "peers: a slot per projection"
        zeros = torch.zeros(peers.world * c, device=device, dtype=torch.float32)
        self.args = (peers.parts_table, peers.flags_table, peers.parts, peers.flags, peers.counters, zeros,
                     peers.rank)
        self.world, self.last = peers.world, 2 * n_layers - 1
        self.summed = torch.empty(1, c, device=device, dtype=dtype)  # the LM head stores the sum here

    def output(self, residual: torch.Tensor) -> SummedInput:
        """The last layer's output, still spread over the ranks: residual (1, C) + the last w2's parts."""
        return SummedInput(residual, self.peers.parts[self.last], self.peers.flags[self.last], self.summed)
