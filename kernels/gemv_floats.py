"""The decode GEMV's loop for Q8_0, Q4_0 and Q4_1 weights against float activations (gemv.dot_rows with
GemvConfig.float_blocks): each tile's integers as fp32 in registers, each block's products summed, then scaled,
the reference's arithmetic up to fp32 rounding:

    Q8_0: d * sum(q x);  Q4_0: d * sum((q - 8) x);  Q4_1: d * sum(q x) + m * sum(x)

A tile is taken as two halves in GGUF's nibble order, the weights b*32 + j and b*32 + 16 + j of each block b
(j < 16): a Q4 byte's low and high nibbles, two runs of 16 Q8_0 bytes; x is loaded at those two index sets, so
the weights are read as stored. Under programmatic dependent launch the first tile, its integers and its scales,
is read before the wait for x and its integers converted to fp32 before it too (pdl.wait_after), so what follows
the wait is a float GEMV's: x, the products, the sums, with no rounding of x on that path. That costs ALU per
weight that the int8 loop (gemv_int8.py) saves, and pays where K is a tile or two and a call's latency bounds it
(tuning.sweep.FLOAT_BLOCKS_MAX_K). Tied to the wait, SmolLM2-135M's Q4_1 step on one H200 (QKV on float
activations) went from 0.3967-0.3971 to 0.3851-0.3858 ms beside bf16's 0.3837-0.3853; tying the bf16 loop's first
tile the same way slowed bf16 to 0.3928-0.4003 ms, so gemv.py's loop keeps the plain wait
(scripts/experiments/tied_wait/)."""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

from llamafast.config import WeightFormat

from .gemv_blocks import block_scales, nibble_floats
from .gemv_tiles import activation
from .pdl import wait_after

FORMATS = (WeightFormat.q8_0, WeightFormat.q4_0, WeightFormat.q4_1)  # the formats this loop reads


@triton.jit
def dot_floats(w_ptr, w2_ptr, s_ptr, s2_ptr, x_ptr, g_ptr, rows, row_mask, K, stride_wn,
               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NORM: tl.constexpr, PAIR: tl.constexpr,
               EVEN_K: tl.constexpr, FMT: tl.constexpr, PDL: tl.constexpr):
    """dot_rows for FMT 3 (Q8_0), 4 (Q4_0), 5 (Q4_1) and float x (times g when NORM): (W x, W2 x, sum(x^2))."""
    NB: tl.constexpr = BLOCK_K // 32
    offs = rows[:, None].to(tl.int64) * stride_wn
    soffs = rows[:, None].to(tl.int64) * (K // 32 * (2 if FMT == 5 else 1))  # Q4_1: (scale, min) pairs
    acc, acc2 = tl.zeros((BLOCK_N, NB), dtype=tl.float32), tl.zeros((BLOCK_N, NB), dtype=tl.float32)
    ss = tl.zeros((BLOCK_K // 2,), dtype=tl.float32)
    start = 0
    if PDL:
        gdc_launch_dependents()
        t = _halves(w_ptr + offs, s_ptr + soffs, 0, K, row_mask, BLOCK_K, FMT)
        t2 = t
        if PAIR:
            t2 = _halves(w2_ptr + offs, s2_ptr + soffs, 0, K, row_mask, BLOCK_K, FMT)
        t, t2 = _waited(t, t2, PAIR)
        acc, acc2, ss = _step(t, t2, x_ptr, g_ptr, 0, K, acc, acc2, ss, BLOCK_N, BLOCK_K, NORM, PAIR, EVEN_K, FMT)
        start = BLOCK_K
    for k0 in range(start, K, BLOCK_K):
        t = _halves(w_ptr + offs, s_ptr + soffs, k0, K, row_mask, BLOCK_K, FMT)
        t2 = t
        if PAIR:
            t2 = _halves(w2_ptr + offs, s2_ptr + soffs, k0, K, row_mask, BLOCK_K, FMT)
        acc, acc2, ss = _step(t, t2, x_ptr, g_ptr, k0, K, acc, acc2, ss, BLOCK_N, BLOCK_K, NORM, PAIR, EVEN_K, FMT)
    return tl.sum(acc, axis=1), tl.sum(acc2, axis=1), tl.sum(ss, axis=0)


@triton.jit
def _halves(row_ptrs, scale_rows, k0, K, row_mask, BLOCK_K: tl.constexpr, FMT: tl.constexpr):
    """The tile at k0: its integers as fp32, (BLOCK_N, BLOCK_K // 2) twice (each block's weights 0-15, then
    16-31; Q4_0's less 8), and its blocks' scales and Q4_1's mins, (BLOCK_N, BLOCK_K // 32) fp32."""
    c = tl.arange(0, BLOCK_K // 2)
    mask = row_mask[:, None] & ((k0 // 32 + c // 16) < K // 32)[None, :]
    if FMT == 3:
        low = (k0 + (c // 16) * 32 + c % 16)[None, :]
        lo = tl.load(row_ptrs + low, mask=mask, other=0, eviction_policy="evict_first").to(tl.float32)
        hi = tl.load(row_ptrs + low + 16, mask=mask, other=0, eviction_policy="evict_first").to(tl.float32)
    else:
        # Runs of 8 bytes to Triton's analysis (the mask keeps c's runs of 16): a thread loads the 16 weights that
        # its 8 bf16 of x (16 bytes) at each of the two index sets multiply. Loaded 16 bytes at a time, x's tiles
        # and each block's sums reached the nibbles' layout through shuffles after the wait (sm_90a SASS at SmolLM2's
        # wo: 497 instructions after the wait, 396 so). Q8_0's bytes stay 16 a load: runs of 8 gave it 607, not 367.
        q = tl.load(row_ptrs + (k0 // 2 + c // 8 * 8 + c % 8)[None, :], mask=mask, other=0,
                    eviction_policy="evict_first")
        lo, hi = nibble_floats(q, FMT == 4)
    kb = k0 // 32 + tl.arange(0, BLOCK_K // 32)
    d = block_scales(scale_rows, kb, K, row_mask, False, FMT == 5, 0)
    m = d
    if FMT == 5:
        m = block_scales(scale_rows, kb, K, row_mask, False, True, 1)
    return lo, hi, d, m


@triton.jit
def _step(t, t2, x_ptr, g_ptr, k0, K, acc, acc2, ss, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
          NORM: tl.constexpr, PAIR: tl.constexpr, EVEN_K: tl.constexpr, FMT: tl.constexpr):
    """The tile's scaled block sums added to acc (and acc2), x's squares to ss."""
    c = tl.arange(0, BLOCK_K // 2)
    low = k0 + (c // 16) * 32 + c % 16
    xl, ss = activation(x_ptr, g_ptr, None, None, ss, low, K, NORM, EVEN_K, 0)
    xh, ss = activation(x_ptr, g_ptr, None, None, ss, low + 16, K, NORM, EVEN_K, 0)
    xsum = tl.sum(tl.reshape(xl + xh, (BLOCK_K // 32, 16)), axis=1)  # each block's activations, for Q4_1's min
    acc += _blocks(t, xl, xh, xsum, BLOCK_N, BLOCK_K, FMT)
    if PAIR:
        acc2 += _blocks(t2, xl, xh, xsum, BLOCK_N, BLOCK_K, FMT)
    return acc, acc2, ss


@triton.jit
def _blocks(t, xl, xh, xsum, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FMT: tl.constexpr):
    """(BLOCK_N, BLOCK_K // 32): d * sum(q x) per block, + m * sum(x) for Q4_1."""
    lo, hi, d, m = t
    part = d * tl.sum(tl.reshape(lo * xl[None, :] + hi * xh[None, :], (BLOCK_N, BLOCK_K // 32, 16)), axis=2)
    if FMT == 5:
        part += m * xsum[None, :]
    return part


@triton.jit
def _waited(t, t2, PAIR: tl.constexpr):
    """The first tile(s) as fp32, returned through the wait for x, so that their conversion runs before it."""
    lo, hi, d, m = t
    lo, hi = wait_after(lo, hi)
    t = (lo, hi, d, m)
    if PAIR:
        lo2, hi2, d2, m2 = t2
        lo2, hi2 = wait_after(lo2, hi2)
        t2 = (lo2, hi2, d2, m2)
    else:
        t2 = t
    return t, t2
