"""The decode step's last op: the sampled token becomes the engine's state and goes to the host, in one program.

    token = nxt;  seen[token] = True;  counts[token] += 1 (COUNTED);  pos += n;  ring[pos % len(ring)] = token;
    x = table[token]  (the next step's input: its embedding row)

torch takes a kernel for each of the first four, and the host then needs the token copied to it after the step:
a device-to-host copy on the stream between one step and the next, which cost 7-10 us a step on an H200
(scripts/experiments/step_gaps/: the steps streamed to the host against the same steps replayed alone). Here the
ring lies in pinned host memory, which the GPU addresses directly, so the program's store is the hand-off: the host
reads the slot of the token's position once the step's event has completed, and no copy waits on the stream: on an
H100 a streamed step now takes what the same steps replayed alone take (scripts/experiments/token_handoff/h100/:
SmolLM2's shape 403.0-404.2 -> 391.7-394.3 us, 7B Q8_0 2,752.3-2,752.7 -> 2,742.9-2,743.1). The host is at most one
step behind the device, so two slots would do; the ring has a few more.
The same program copies the token's embedding row into the buffer the next step starts from, so the step begins
with its first layer instead of torch's gather (a kernel of 3.3-4.6 us in an H100's timelines). One H100, one
process, alternated (scripts/experiments/embedding_row/h100/): SmolLM2's shape bf16 390.8-391.2 -> 387.0-387.3 us
a step, FP8 E5M2 364.0-364.3 -> 359.5-360.1; 7B FP8 2,621.6-2,622.3 -> 2,616.7-2,619.7, bf16 4,598.6-4,598.8 ->
4,597.1-4,597.4; greedy tokens equal.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import check_vector, next_pow2

BLOCK = 8192  # embedding values a load covers at most: Llama-2-70B's row at once


@triton.jit
def _advance_kernel(nxt_ptr, token_ptr, seen_ptr, counts_ptr, pos_ptr, ring_ptr, table_ptr, x_ptr, n, dim,
                    RING: tl.constexpr, COUNTED: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.load(nxt_ptr)
    for c in range(0, dim, BLOCK):  # the row first: the next step waits on it
        offs = c + tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, tl.load(table_ptr + t * dim + offs, mask=offs < dim), mask=offs < dim)
    tl.store(token_ptr, t)
    tl.store(seen_ptr + t, tl.full((), 1, tl.int1))
    if COUNTED:
        tl.store(counts_ptr + t, tl.load(counts_ptr + t) + 1)
    p = tl.load(pos_ptr) + n
    tl.store(pos_ptr, p)
    tl.store(ring_ptr + p % RING, t)


def advance_state(nxt: torch.Tensor, token: torch.Tensor, seen: torch.Tensor, counts: torch.Tensor,
                  pos: torch.Tensor, ring: torch.Tensor, x: torch.Tensor, table: torch.Tensor, n: int,
                  counted: bool) -> None:
    """nxt (1,) int64, the sampled token, into token (1,) int64 and seen (V,) bool, counted in counts (V,) int32
    when counted; pos (), int64, moved on by n; the token into ring (R,) int64 at the new position modulo R (on a
    GPU a pinned host tensor, which the program writes through); x (1, C) takes the token's row of table (V, C)."""
    check_vector("seen", seen, counts.numel())
    assert nxt.dtype == token.dtype == pos.dtype == ring.dtype == torch.int64, "nxt, token, pos, ring: int64"
    assert seen.dtype == torch.bool and counts.dtype == torch.int32, "seen: bool, counts: int32"
    dim = table.shape[1]
    assert table.is_contiguous() and table.shape[0] == seen.numel(), "table: (V, C), contiguous"
    assert x.dtype == table.dtype, "x: the table's dtype"
    check_vector("x", x, dim)
    _advance_kernel[(1,)](nxt, token, seen, counts, pos, ring, table, x, n, dim, RING=ring.numel(), COUNTED=counted,
                          BLOCK=min(BLOCK, next_pow2(dim)), num_warps=4)
