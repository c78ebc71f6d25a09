"""What a decode GEMV program loads (gemv.dot_rows): weight tiles as stored, slices of the activation (RMSNorm-
weighted, plus the tensor-parallel ranks' partials), and E4M3 weights' row scales."""

from __future__ import annotations

import triton
import triton.language as tl

from ._common import decode_weights


@triton.jit
def load_tile(row_ptrs, k, K, row_mask, EVEN_K: tl.constexpr, W_FP8: tl.constexpr):
    """A (BLOCK_N, BLOCK_K) weight tile as stored, read once: stream it past the cache. FP8 weights arrive as int8
    and are bitcast; the caller upcasts them where it multiplies."""
    if W_FP8 == 1 or W_FP8 == 2:
        # The same k, but runs of 8 to Triton's analysis, so a thread loads 8 FP8 weights at a time: the 8 bf16
        # activations (16 bytes) it multiplies them by. At 16 bytes, x reached that layout through shared memory
        # with two barriers in every loop step (sm_90a SASS); 7B FP8 step on an H200 2.188 -> 2.117 ms/token,
        # 70B 20.81 -> 18.36, with launches walked again (scripts/experiments/fp8_layout/).
        k = k // 8 * 8 + k % 8
    if EVEN_K:  # no mask along K, so the loads stay full width
        w = tl.load(row_ptrs + k[None, :], mask=row_mask[:, None], other=0, eviction_policy="evict_first")
    else:
        mask = row_mask[:, None] & (k < K)[None, :]
        w = tl.load(row_ptrs + k[None, :], mask=mask, other=0, eviction_policy="evict_first")
    return decode_weights(w, W_FP8)


@triton.jit
def pair_tiles(row_ptrs, row_ptrs2, k, K, row_mask, EVEN_K: tl.constexpr, W_FP8: tl.constexpr, PAIR: tl.constexpr):
    """The tiles at k of W and, when PAIR, of W2 (else W's again), as stored."""
    w = load_tile(row_ptrs, k, K, row_mask, EVEN_K, W_FP8)
    w2 = w
    if PAIR:
        w2 = load_tile(row_ptrs2, k, K, row_mask, EVEN_K, W_FP8)
    return w, w2


@triton.jit
def load_vector(ptr, k, K, EVEN_K: tl.constexpr):
    """A K-slice of a small vector that every program reads: keep it in cache."""
    if EVEN_K:
        return tl.load(ptr + k, eviction_policy="evict_last").to(tl.float32)
    return tl.load(ptr + k, mask=k < K, other=0.0, eviction_policy="evict_last").to(tl.float32)


@triton.jit
def activation(x_ptr, g_ptr, p_ptr, xo_ptr, ss, k, K, NORM: tl.constexpr, EVEN_K: tl.constexpr, PARTS: tl.constexpr,
               share=0, SHARES: tl.constexpr = 0):
    """The K-slice k of the input (plus the ranks' partials), RMSNorm-weighted when NORM; ss gains its squares."""
    x = load_vector(x_ptr, k, K, EVEN_K)
    if PARTS > 0:
        x = add_parts(x, p_ptr, xo_ptr, k, K, EVEN_K, PARTS, share, SHARES)
    if NORM:
        ss += x * x
        x = x * load_vector(g_ptr, k, K, EVEN_K)
    return x, ss


@triton.jit
def add_parts(x, p_ptr, xo_ptr, k, K, EVEN_K: tl.constexpr, PARTS: tl.constexpr, share=0, SHARES: tl.constexpr = 0):
    """x + the ranks' partial sums (PARTS rows of K fp32, added in rank order, so every rank gets the same bits),
    rounded to the residual stream's dtype as the one-GPU linear_residual rounds it; program 0 stores it, or with
    SHARES (the persistent step, whose programs need not take a task of every op) task `share` of SHARES stores
    the elements k % SHARES == share."""
    for r in tl.static_range(PARTS):
        x += load_vector(p_ptr + r * K, k, K, EVEN_K)
    x = x.to(xo_ptr.dtype.element_ty)
    if SHARES > 0:
        tl.store(xo_ptr + k, x, mask=(k < K) & (k % SHARES == share))
    else:
        tl.store(xo_ptr + k, x, mask=(k < K) & (tl.program_id(0) == 0))
    return x.to(tl.float32)


@triton.jit
def row_scaled(out, out2, s_ptr, s2_ptr, rows, row_mask, PAIR: tl.constexpr, W_FP8: tl.constexpr):
    """The finished row sums times E4M3 weights' per-row scales (applied once, since they are per row)."""
    if W_FP8 == 2:
        out = out * tl.load(s_ptr + rows, mask=row_mask, other=0.0)
        if PAIR:
            out2 = out2 * tl.load(s2_ptr + rows, mask=row_mask, other=0.0)
    return out, out2
