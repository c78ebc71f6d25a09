"""Block-format weight tiles for the prefill matmuls (tiles.dot_tiles with W_FP8 3-8: Q8_0, Q4_0, Q4_1, Q4_K, Q5_K,
Q6_K; layout in docs/quantized.md): a (BLOCK_N, BLOCK_K) tile of W dequantized in registers, scales applied, so a
short prompt reads each weight as stored instead of a bf16 copy written just before (llamafast.backends chooses
by row count: every row tile of the output dequantizes its weight tiles again).

A Q4 tile's bytes hold weights b*32 + j (low nibble) and b*32 + 16 + j (high) of block b. The tile handed to tl.dot
is put back in K order, so that the activation tile stays one contiguous load (TMA-able): the (BLOCK_N, NB, 16)
low and high weights are joined to (BLOCK_N, NB, 16, 2), permuted to (BLOCK_N, NB, 2, 16) and flattened.
The integers and scales come from the block readers (gemv_blocks.py, gemv_kquants.py), as
dequantize_blocks.py's scratch path reads them. Legend: NB blocks of 32 weights in a tile.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..gemv_blocks import block_scales, int8_floats, nibble_floats
from ..gemv_kquants import k_floats, k_scales


@triton.jit
def block_tile(row_ptrs, s_ptr, cols, k0, N, K, EVEN_K: tl.constexpr, FMT: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr):
    """Weights k0 .. k0 + BLOCK_K - 1 of rows `cols` (row_ptrs: their first bytes, (BLOCK_N, 1)) as (BLOCK_N,
    BLOCK_K) fp32 in K order; BLOCK_K a multiple of 32. Rows past N and weights past K are zeros (their scales
    are masked to 0)."""
    NB: tl.constexpr = BLOCK_K // 32
    col_ok = cols < N
    kb = k0 // 32 + tl.arange(0, NB)  # the tile's blocks
    if FMT == 3:  # Q8_0: int8 (BLOCK_N, BLOCK_K) times each block's scale
        k = k0 + tl.arange(0, BLOCK_K)
        mask = col_ok[:, None] if EVEN_K else col_ok[:, None] & (k < K)[None, :]
        q = tl.load(row_ptrs + k[None, :], mask=mask, other=0)
        d = block_scales(s_ptr + cols[:, None].to(tl.int64) * (K // 32), kb, K, col_ok, EVEN_K, False, 0)
        w = tl.reshape(int8_floats(q), (BLOCK_N, NB, 32)) * d[:, :, None]
    else:
        lo, hi = _nibble_weights(row_ptrs, s_ptr, cols, col_ok, kb, k0, K, EVEN_K, FMT, BLOCK_N, BLOCK_K)
        w = tl.permute(tl.join(lo, hi), (0, 1, 3, 2))  # (BLOCK_N, NB, 2, 16): K order
    return tl.reshape(w, (BLOCK_N, BLOCK_K))


@triton.jit
def _nibble_weights(row_ptrs, s_ptr, cols, col_ok, kb, k0, K, EVEN_K: tl.constexpr, FMT: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The Q4 and K-quant formats: (BLOCK_N, NB, 16) fp32 weights b*32 + j and b*32 + 16 + j of the tile's blocks
    b, scaled (and their mins added)."""
    NB: tl.constexpr = BLOCK_K // 32
    HALF: tl.constexpr = BLOCK_K // 2
    if FMT >= 6:  # the K-quants: d*sc * q - dmin*m per half block, Q6_K's q less 32 and no min
        lo, hi = k_floats(row_ptrs, k0 // 2, K, col_ok, EVEN_K, FMT, BLOCK_N, HALF)
        smask = col_ok[:, None] if EVEN_K else col_ok[:, None] & (kb < K // 32)[None, :]
        s_lo, s_hi, m = k_scales(s_ptr, cols, kb, K, smask, FMT)
        m = -m
    else:  # Q4_0 d * (q - 8), Q4_1 d * q + m
        b = k0 // 2 + tl.arange(0, HALF)
        mask = col_ok[:, None] if EVEN_K else col_ok[:, None] & (b < K // 2)[None, :]
        lo, hi = nibble_floats(tl.load(row_ptrs + b[None, :], mask=mask, other=0), FMT == 4)
        s_rows = s_ptr + cols[:, None].to(tl.int64) * (K // 32 * (2 if FMT == 5 else 1))  # Q4_1: (scale, min)
        s_lo = block_scales(s_rows, kb, K, col_ok, EVEN_K, FMT == 5, 0)
        s_hi = s_lo
        m = block_scales(s_rows, kb, K, col_ok, EVEN_K, True, 1) if FMT == 5 else s_lo
    lo = tl.reshape(lo, (BLOCK_N, NB, 16)) * s_lo[:, :, None]
    hi = tl.reshape(hi, (BLOCK_N, NB, 16)) * s_hi[:, :, None]
    if FMT != 4 and FMT != 8:  # Q4_1's, Q4_K's and Q5_K's mins
        lo, hi = lo + m[:, :, None], hi + m[:, :, None]
    return lo, hi
