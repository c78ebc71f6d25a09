"""The decode step's last op: the sampled token becomes the engine's state and goes to the host, in one program.

    token = nxt;  seen[token] = True;  counts[token] += 1 (COUNTED);  pos += n;  ring[pos % len(ring)] = token

torch takes a kernel for each of the first four, and the host then needs the token copied to it after the step:
a device-to-host copy on the stream between one step and the next, which cost 7-10 us a step on an H200
(scripts/experiments/step_gaps/: the steps streamed to the host against the same steps replayed alone). Here the
ring lies in pinned host memory, which the GPU addresses directly, so the program's store is the hand-off: the host
reads the slot of the token's position once the step's event has completed, and no copy waits on the stream: on an
H100 a streamed step now takes what the same steps replayed alone take (scripts/experiments/token_handoff/h100/:
SmolLM2's shape 403.0-404.2 -> 391.7-394.3 us, 7B Q8_0 2,752.3-2,752.7 -> 2,742.9-2,743.1). The host is at most one
step behind the device, so two slots would do; the ring has a few more.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import check_vector


@triton.jit
def _advance_kernel(nxt_ptr, token_ptr, seen_ptr, counts_ptr, pos_ptr, ring_ptr, n, RING: tl.constexpr,
                    COUNTED: tl.constexpr):
    t = tl.load(nxt_ptr)
    tl.store(token_ptr, t)
    tl.store(seen_ptr + t, tl.full((), 1, tl.int1))
    if COUNTED:
        tl.store(counts_ptr + t, tl.load(counts_ptr + t) + 1)
    p = tl.load(pos_ptr) + n
    tl.store(pos_ptr, p)
    tl.store(ring_ptr + p % RING, t)


def advance_state(nxt: torch.Tensor, token: torch.Tensor, seen: torch.Tensor, counts: torch.Tensor,
                  pos: torch.Tensor, ring: torch.Tensor, n: int, counted: bool) -> None:
    """nxt (1,) int64, the sampled token, into token (1,) int64 and seen (V,) bool, counted in counts (V,) int32
    when counted; pos (), int64, moved on by n; the token into ring (R,) int64 at the new position modulo R (on a
    GPU a pinned host tensor, which the program writes through)."""
    check_vector("seen", seen, counts.numel())
    assert nxt.dtype == token.dtype == pos.dtype == ring.dtype == torch.int64, "nxt, token, pos, ring: int64"
    assert seen.dtype == torch.bool and counts.dtype == torch.int32, "seen: bool, counts: int32"
    _advance_kernel[(1,)](nxt, token, seen, counts, pos, ring, n, RING=ring.numel(), COUNTED=counted, num_warps=1)
