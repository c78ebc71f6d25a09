"""The merge of decode attention's splits (decode_attention.py), run by each KV head's last split program to
finish: the head's outputs from its used splits' partial outputs, weighted by their softmax mass (log-sum-exp).
Every head of the group is merged in one pass, because head after head each head's loads wait on the store
before them: so merged, a Llama-2-70B merge (8 heads a KV head) cost about 10 us, attention taking 16.0-16.2 us
at every length that used two splits against 5.7 in one; in one pass 8.8-10.3 (one H200,
scripts/experiments/attention_merge/).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._common import dot_dim, next_pow2

# Partial values a merge loads at once (merge_blocks): every head of the group and as many splits as fit, so a
# merge waits on memory about once, not once a head (64 fp32 a thread at 2 warps).
MERGE_VALUES = 4096


def merge_blocks(group: int, head_dim: int, n_splits: int) -> tuple[int, int]:
    """The merge's tile: (heads padded to a power of two, splits a load), the splits no more than the grid has
    and the tile at most MERGE_VALUES partial values."""
    g = next_pow2(group)
    return g, max(1, min(next_pow2(n_splits), MERGE_VALUES // (g * dot_dim(head_dim))))


@triton.jit
def merge_head(part_ptr, lse_ptr, out_ptr, h, n_splits, used, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
               BLOCK_SPLITS: tl.constexpr):
    """Head h's output where a KV head serves one: its splits in one 2-D tile, which issues 64 fewer
    instructions than merge_heads' 3-D one at 7B (sm_90a SASS); 7B FP8 E5M2 read 0.3-0.9% faster with it in
    three calls on one H200 (scripts/experiments/attention_merge/)."""
    sp = tl.arange(0, BLOCK_SPLITS)
    d = tl.arange(0, BLOCK_D)
    lse = tl.load(lse_ptr + h * n_splits + sp, mask=sp < used, other=float("-inf"))
    w = tl.exp(lse - tl.max(lse, axis=0))  # split 0 always holds position 0, so the max is finite
    mask = (sp < used)[:, None] & (d < HEAD_DIM)[None, :]
    part = tl.load(part_ptr + (h * n_splits + sp)[:, None] * HEAD_DIM + d[None, :], mask=mask, other=0.0)
    out = tl.sum(part * w[:, None], axis=0) / tl.sum(w, axis=0)
    tl.store(out_ptr + h * HEAD_DIM + d, out.to(out_ptr.dtype.element_ty), mask=d < HEAD_DIM)


@triton.jit
def merge_heads(part_ptr, lse_ptr, out_ptr, kvh, n_splits, used, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
                BLOCK_D: tl.constexpr, BLOCK_SPLITS: tl.constexpr, MERGE_G: tl.constexpr,
                MERGE_CHUNK: tl.constexpr):
    """The KV head's GROUP outputs: each head's used splits' partial outputs weighted by their softmax mass
    (log-sum-exp), every head at once, MERGE_CHUNK splits a load."""
    g = tl.arange(0, MERGE_G)
    sp = tl.arange(0, BLOCK_SPLITS)
    heads = kvh * GROUP + g
    live = g < GROUP
    rows = heads[:, None] * n_splits + sp[None, :]
    used_rows = live[:, None] & (sp < used)[None, :]
    lse = tl.load(lse_ptr + rows, mask=used_rows, other=float("-inf"))
    top = tl.where(live, tl.max(lse, axis=1), 0.0)  # split 0 always holds position 0: finite for a live head
    if MERGE_CHUNK == BLOCK_SPLITS:  # one load holds every split
        acc, mass = _weighted(part_ptr, rows, used_rows, tl.exp(lse - top[:, None]), HEAD_DIM, BLOCK_D)
    else:
        c = tl.arange(0, MERGE_CHUNK)
        mass = tl.zeros((MERGE_G,), dtype=tl.float32)
        acc = tl.zeros((MERGE_G, BLOCK_D), dtype=tl.float32)
        for s0 in range(0, used, MERGE_CHUNK):
            chunk = heads[:, None] * n_splits + (s0 + c)[None, :]  # (MERGE_G, MERGE_CHUNK) rows
            held = live[:, None] & (s0 + c < used)[None, :]
            w = tl.exp(tl.load(lse_ptr + chunk, mask=held, other=float("-inf")) - top[:, None])
            part, m = _weighted(part_ptr, chunk, held, w, HEAD_DIM, BLOCK_D)
            acc += part
            mass += m
    out = acc / tl.where(live, mass, 1.0)[:, None]
    d = tl.arange(0, BLOCK_D)
    tl.store(out_ptr + heads[:, None] * HEAD_DIM + d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=live[:, None] & (d < HEAD_DIM)[None, :])


@triton.jit
def _weighted(part_ptr, rows, held, w, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """The partial outputs of rows (heads x splits, where held) summed per head with weights w, and w's sums."""
    d = tl.arange(0, BLOCK_D)
    part = tl.load(part_ptr + rows[:, :, None] * HEAD_DIM + d[None, None, :],
                   mask=held[:, :, None] & (d < HEAD_DIM)[None, None, :], other=0.0)
    return tl.sum(part * w[:, :, None], axis=1), tl.sum(w, axis=1)
