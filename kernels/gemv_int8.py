"""The decode GEMV's loop for Q8_0, Q4_0, Q4_1 and Q4_K weights against int8 activations (gemv.dot_rows, when its
x is quantize_activation.py's workspace): weights and activations are read as 32-bit words of four integers, dp4a
multiplies and sums each pair of words in one instruction, and each block's integer sum becomes a float once:

    Q8_0: d * dx * sum(q * qx);  Q4_0: d * dx * (sum(q * qx) - 8 * sum(qx));  Q4_1: the same plus m * dx * sum(qx)
    Q4_K: dx * (d*sc * sum(q * qx) - dmin*m * sum(qx)), its nibbles in Q4_0's order

At Llama-2-7B's shapes on an H100 this runs the Q4_0 GEMVs at 60-86% of copy bandwidth where unpacking each weight
to fp32 (gemv_blocks.py) ran them at 40-63%, and Q8_0 at 76-101% against 68-96% (scripts/experiments/dp4a_gemv.txt)."""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ._common import INTERPRET
from .gemv_blocks import block_scales
from .gemv_kquants import k_scales
from .quantize_activation import workspace_parts

_ASM = tl.constexpr(not INTERPRET)
# One Q4 word holds 8 weights: its low nibbles are 4 consecutive weights of a block, its high ones the 4 that lie
# 16 further on (GGUF's order), so it meets two activation words: (lo, hi) -> dp4a(lo nibbles, xl) + dp4a(hi, xh).
_Q4_DOT = tl.constexpr("{ .reg .b32 l, h; and.b32 l, $1, 0x0F0F0F0F; shr.u32 h, $1, 4; and.b32 h, h, 0x0F0F0F0F; "
                       "dp4a.u32.s32 $0, l, $2, 0; dp4a.u32.s32 $0, h, $3, $0; }")
_Q8_DOT = tl.constexpr("dp4a.s32.s32 $0, $1, $2, 0;")


@triton.jit
def _bytes_dot(a, b, A_SIGNED: tl.constexpr):
    """dp4a for the interpreter, which runs no PTX: the sum of the products of a's and b's bytes (b's signed)."""
    acc = tl.zeros_like(a)
    for j in tl.static_range(4):
        ab = (a >> (8 * j)) & 0xFF
        if A_SIGNED:
            ab = ab - ((ab & 0x80) << 1)
        bb = (b >> (8 * j)) & 0xFF
        acc += ab * (bb - ((bb & 0x80) << 1))
    return acc


@triton.jit
def _q4_dot(w, xl, xh):
    if _ASM:
        return tl.inline_asm_elementwise(_Q4_DOT, "=r,r,r,r", [w, xl, xh], dtype=tl.int32, is_pure=True, pack=1)
    return _bytes_dot(w & 0x0F0F0F0F, xl, False) + _bytes_dot((w >> 4) & 0x0F0F0F0F, xh, False)


@triton.jit
def _q8_dot(w, x):
    if _ASM:
        return tl.inline_asm_elementwise(_Q8_DOT, "=r,r,r", [w, x], dtype=tl.int32, is_pure=True, pack=1)
    return _bytes_dot(w, x, True)


@triton.jit
def dot_int8(w_ptr, w2_ptr, s_ptr, s2_ptr, x_ptr, rows, row_mask, K, stride_wn,
             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NORM: tl.constexpr, PAIR: tl.constexpr,
             EVEN_K: tl.constexpr, FMT: tl.constexpr, PDL: tl.constexpr):
    """dot_rows for FMT 3 (Q8_0), 4 (Q4_0), 5 (Q4_1), 6 (Q4_K) with x the int8 workspace; sum(x^2) comes from it
    (NORM)."""
    NB: tl.constexpr = BLOCK_K // 32
    C: tl.constexpr = BLOCK_K // 4 if FMT == 3 else BLOCK_K // 8  # weight words per tile row
    offs = rows[:, None].to(tl.int64) * (stride_wn // 4)
    w_words = w_ptr.to(tl.pointer_type(tl.int32), bitcast=True) + offs
    w2_words = w2_ptr.to(tl.pointer_type(tl.int32), bitcast=True) + offs
    acc, acc2 = tl.zeros((BLOCK_N, NB), dtype=tl.float32), tl.zeros((BLOCK_N, NB), dtype=tl.float32)
    ss = tl.zeros((NB,), dtype=tl.float32)
    start = 0
    if PDL:  # the first weight tile is read while the kernel that writes x still runs (gemv._first_tile)
        gdc_launch_dependents()
        w = _words(w_words, 0, K, row_mask, EVEN_K, C, FMT)
        w2 = w
        if PAIR:
            w2 = _words(w2_words, 0, K, row_mask, EVEN_K, C, FMT)
        gdc_wait()
        acc, acc2, ss = _tile(w, w2, s_ptr, s2_ptr, rows, x_ptr, 0, K, row_mask, acc, acc2, ss, BLOCK_N, BLOCK_K,
                              NORM, PAIR, EVEN_K, FMT)
        start = BLOCK_K
    for k0 in range(start, K, BLOCK_K):
        w = _words(w_words, k0, K, row_mask, EVEN_K, C, FMT)
        w2 = w
        if PAIR:
            w2 = _words(w2_words, k0, K, row_mask, EVEN_K, C, FMT)
        acc, acc2, ss = _tile(w, w2, s_ptr, s2_ptr, rows, x_ptr, k0, K, row_mask, acc, acc2, ss, BLOCK_N, BLOCK_K,
                              NORM, PAIR, EVEN_K, FMT)
    return tl.sum(acc, axis=1), tl.sum(acc2, axis=1), tl.sum(ss, axis=0)


@triton.jit
def _words(w_words, k0, K, row_mask, EVEN_K: tl.constexpr, C: tl.constexpr, FMT: tl.constexpr):
    """The (BLOCK_N, C) weight words of the tile at k0, as stored."""
    word = (k0 // 4 if FMT == 3 else k0 // 8) + tl.arange(0, C)
    mask = row_mask[:, None] if EVEN_K else row_mask[:, None] & (word < (K // 4 if FMT == 3 else K // 8))[None, :]
    return tl.load(w_words + word[None, :], mask=mask, other=0, eviction_policy="evict_first")


@triton.jit
def _tile(w, w2, s_ptr, s2_ptr, rows, x_ptr, k0, K, row_mask, acc, acc2, ss, BLOCK_N: tl.constexpr,
          BLOCK_K: tl.constexpr, NORM: tl.constexpr, PAIR: tl.constexpr, EVEN_K: tl.constexpr, FMT: tl.constexpr):
    """The tile at k0 of the weight words w (and w2) added to acc (acc2), its blocks' sum(x^2) to ss."""
    xq_ptr, dx_ptr, xs_ptr, ss_ptr = workspace_parts(x_ptr, K)
    NB: tl.constexpr = BLOCK_K // 32
    C: tl.constexpr = BLOCK_K // 4 if FMT == 3 else BLOCK_K // 8
    c = tl.arange(0, C)
    bk = k0 // 32 + tl.arange(0, NB)
    bmask = bk < K // 32
    xw = k0 // 4 + c if FMT == 3 else k0 // 4 + (c // 4) * 8 + c % 4  # Q4: the low nibbles' activation word
    cmask = (k0 // 4 + c < K // 4) if FMT == 3 else (k0 // 8 + c < K // 8)
    xa = tl.load(xq_ptr + xw, mask=cmask, other=0)
    xb = xa
    if FMT != 3:
        xb = tl.load(xq_ptr + xw + 4, mask=cmask, other=0)
    dx = tl.load(dx_ptr + bk, mask=bmask, other=0.0)
    xs = tl.load(xs_ptr + bk, mask=bmask, other=0)
    if NORM:
        ss += tl.load(ss_ptr + bk, mask=bmask, other=0.0)
    acc += _blocks(w, s_ptr, rows, bk, xa, xb, dx, xs, row_mask, K, BLOCK_N, NB, C, EVEN_K, FMT)
    if PAIR:
        acc2 += _blocks(w2, s2_ptr, rows, bk, xa, xb, dx, xs, row_mask, K, BLOCK_N, NB, C, EVEN_K, FMT)
    return acc, acc2, ss


@triton.jit
def _blocks(w, s_ptr, rows, bk, xa, xb, dx, xs, row_mask, K, BLOCK_N: tl.constexpr, NB: tl.constexpr,
            C: tl.constexpr, EVEN_K: tl.constexpr, FMT: tl.constexpr):
    """One tile's (BLOCK_N, NB) block products, scaled."""
    if FMT == 3:
        p = _q8_dot(w, tl.broadcast_to(xa[None, :], (BLOCK_N, C)))
    else:
        p = _q4_dot(w, tl.broadcast_to(xa[None, :], (BLOCK_N, C)), tl.broadcast_to(xb[None, :], (BLOCK_N, C)))
    isum = tl.sum(tl.reshape(p, (BLOCK_N, NB, C // NB)), axis=2)
    if FMT == 6:  # Q4_K: Q4_1's sums, with the scale d*sc and the min -dmin*m of each block's 6-bit pair
        smask = row_mask[:, None] if EVEN_K else row_mask[:, None] & (bk < K // 32)[None, :]
        ds, _, m = k_scales(s_ptr, rows, bk, K, smask, FMT)
        return (isum.to(tl.float32) * ds - m * xs.to(tl.float32)[None, :]) * dx[None, :]
    if FMT == 4:
        isum -= 8 * xs[None, :]
    scale_rows = s_ptr + rows[:, None].to(tl.int64) * (K // 32 * (2 if FMT == 5 else 1))  # Q4_1: (scale, min)
    d = block_scales(scale_rows, bk, K, row_mask, EVEN_K, FMT == 5, 0)
    part = isum.to(tl.float32) * d * dx[None, :]
    if FMT == 5:
        part += block_scales(scale_rows, bk, K, row_mask, EVEN_K, True, 1) * (dx * xs.to(tl.float32))[None, :]
    return part
