"""Tensor parallel without an all-reduce kernel: row-parallel projections push their partial sums into every
rank's symmetric-memory buffer, and the next fused kernel adds them while it reads its input.

Under Megatron sharding (attention by heads, the FFN by neurons) wo and w2 each leave a partial (C,) sum on
every rank. Here the projection that makes it (push_linear, or the LM head with push=) stores its rows straight
into each peer's buffer over NVLink, each value tagged with the decode step (tagged.py: C x 8 bytes per peer per
sync). The consumer, rmsnorm_qkv_rope / rmsnorm_swiglu / rmsnorm_lm_head given a SummedInput, reads the partials
slice by slice as it streams its weights, each slice once its words carry this step's tag (gemv._add_parts), sums
residual + the N partials in rank order and stores that sum for the next residual. Nothing waits for a whole
kernel on another GPU and nothing is reset: the step's tag is one int32 per rank (Peers.epoch), raised after the
step's logits. Pushing rather than pulling: every consumer program needs the whole input vector, so pulling it
from the peers would cross NVLink once per program (hundreds of times per sync) instead of once.

This replaced flags raised by each producer's last program (a ticket per program, a system-scope fence, one
remote atomic per peer) that the consumers spun on before reading anything: on 2 H200s at Llama-2-7B those cost
8.0 us (GPU-scope ticket) and 8.6 us (system-scope) per synchronisation point over the step without any
communication, and NCCL's all-reduce 9.6 us (scripts/results/tp/h200x2_flags/).

Decode has 2 synchronisation points per layer (after wo, after w2) and one for the vocabulary-sharded logits.
Buffers are per (layer, op) slot, so a slot is only rewritten in the next decode step: a rank writes slot s of
step t+1 only after it has read, from every peer, a slot that the peer pushed after it had read slot s of step t
(slot s - 1 of step t+1; for slot 0, the last slot of step t), since each rank's kernels run in order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from llamafast.config import Weight

from ._common import cdiv, check_rows, check_vector, scale_arg
from .gemv import GemvConfig, dot_rows, gemv_config, launch_args
from .tagged import load_tagged, tag_values
from .linear_residual import CONFIGS as LINEAR_CONFIGS

CONFIGS: dict[tuple[int, int, int], GemvConfig] = {}  # (N, K, bytes) -> launch; linear_residual's shapes otherwise
LOGITS_BLOCK = 1024  # logits per program of the wait: 32 programs at a 32,000-word vocabulary


@dataclass(frozen=True)
class Peers:
    """One rank's view of the symmetric buffers: int64 tables of every rank's base addresses (device tensors) and
    this rank's own tensors. parts (slots, N, C) int64 tagged words; epoch (1,) int32, local: this step's tag,
    1 at the first step (the buffers start at tag 0)."""

    rank: int
    world: int
    parts_table: torch.Tensor  # (N,) int64: each rank's parts base
    parts: torch.Tensor
    epoch: torch.Tensor
    logits_table: torch.Tensor | None = None  # (N,) int64: each rank's (V,) tagged logits, vocabulary sharded
    logits: torch.Tensor | None = None
    logits_out: torch.Tensor | None = None  # (1, V) fp32, local: the whole row, untagged


@dataclass(frozen=True)
class SummedInput:
    """A decode input still spread over the ranks: residual + sum of parts (N, C) tagged words, complete once
    every word carries the tag in epoch (1,) int32. The consuming kernel stores the sum into `summed` (1, C), the
    next residual."""

    residual: torch.Tensor
    parts: torch.Tensor
    epoch: torch.Tensor
    summed: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return self.residual.shape


def consumer_args(x) -> tuple[torch.Tensor, dict]:
    """(the tensor to check shapes against, the kernel arguments that make a consumer add the parts)."""
    if not hasattr(x, "summed"):  # duck-typed: kernels/ is importable as llamafast.kernels and as kernels
        return x, {}
    return x.residual, {"p_ptr": x.parts, "xo_ptr": x.summed, "e_ptr": x.epoch, "PARTS": x.parts.shape[0]}


@triton.jit
def push_rows(values, rows, mask, table_ptr, offset, e_ptr, WORLD: tl.constexpr):
    """Stores values at rows + offset of every rank's buffer (table_ptr: their base addresses), tagged with this
    step's tag."""
    words = tag_values(values, tl.load(e_ptr))
    for r in tl.static_range(WORLD):
        base = tl.load(table_ptr + r).to(tl.pointer_type(tl.int64))
        tl.store(base + offset + rows, words, mask=mask)


@triton.jit
def _push_linear_kernel(
    x_ptr, w_ptr, s_ptr, table_ptr, e_ptr,  # x (K,), W (N, K), E4M3 scales (N,); parts bases; the step's tag
    N, K, stride_wn, offset,  # rows go to offset + row in each rank's parts buffer
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, W_FP8: tl.constexpr, WORLD: tl.constexpr,
    PDL: tl.constexpr = False,  # launched with programmatic dependent launch (gemv.use_pdl)
):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = rows < N
    acc, _, _ = dot_rows(
        w_ptr, w_ptr, s_ptr, s_ptr, x_ptr, x_ptr, rows, mask, K, stride_wn, BLOCK_N, BLOCK_K, False, False, EVEN_K, W_FP8,
        PDL=PDL,
    )
    push_rows(acc, rows, mask, table_ptr, offset, e_ptr, WORLD)


@triton.jit
def _wait_logits_kernel(words_ptr, out_ptr, e_ptr, V, BLOCK: tl.constexpr):
    k = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + k, load_tagged(words_ptr, k, V, tl.load(e_ptr)), mask=k < V)


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
        x, w.data, scale_arg(w), peers.parts_table, peers.epoch,
        n, k, w.data.stride(0), (slot * peers.world + peers.rank) * c,
        WORLD=peers.world, **launch_args(cfg, w, pdl=True),
    )
    return SummedInput(residual, peers.parts[slot], peers.epoch, torch.empty_like(residual))


def wait_logits(peers: Peers) -> torch.Tensor:
    """Every rank's logits shard (pushed by rmsnorm_lm_head), once all have arrived: the whole (1, V) row."""
    v = peers.logits.shape[0]
    _wait_logits_kernel[(cdiv(v, LOGITS_BLOCK),)](peers.logits, peers.logits_out, peers.epoch, v, BLOCK=LOGITS_BLOCK)
    return peers.logits_out


def next_step(peers: Peers) -> None:
    """The step's last exchange is done on this rank: the next step's words carry the next tag."""
    peers.epoch.add_(1)
