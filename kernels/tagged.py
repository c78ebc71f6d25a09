"""Values that carry the decode step they belong to, for the tensor-parallel exchange (tp_sync.py).

A value travels as one int64 word: its fp32 bits in the low half, the step's tag in the high half, written with
one aligned 8-byte store, which a reader sees whole or not at all (NCCL's LL protocol rests on the same property
of NVLink). So a reader that finds the tag it expects has the value: no fence, no flag, no reset between steps;
a word of an earlier step still holds an older tag.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def tag_values(values, tag):
    """(..,) fp32 values and an int32 tag -> (..,) int64 words."""
    bits = values.to(tl.float32).to(tl.uint32, bitcast=True).to(tl.int64)  # zero-extended
    return bits | (tag.to(tl.int64) << 32)


@triton.jit
def _stale(words, mask, tag):
    return tl.sum(tl.where(mask, ((words >> 32).to(tl.int32) != tag).to(tl.int32), 0), axis=0)


@triton.jit
def load_tagged(ptr, k, K, tag):
    """fp32 values at ptr + k (k < K), once every word carries tag. The first load may hit a line cached before
    the words arrived; the tags say so, and the loads that follow are volatile (from L2, where the peers' stores
    land)."""
    mask = k < K
    words = tl.load(ptr + k, mask=mask, other=0)
    stale = _stale(words, mask, tag)
    while stale > 0:
        words = tl.load(ptr + k, mask=mask, other=0, volatile=True)
        stale = _stale(words, mask, tag)
    return words.to(tl.int32).to(tl.float32, bitcast=True)
