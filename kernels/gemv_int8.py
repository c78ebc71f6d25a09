"""The decode GEMV's loop for block weights against int8 activations (gemv.dot_rows): weights and activations are
read as 32-bit words of four integers, dp4a multiplies and sums each pair of words in one instruction, and each
block's integer sum becomes a float once:

    Q8_0: d * dx * sum(q * qx);  Q4_0: d * dx * (sum(q * qx) - 8 * sum(qx));  Q4_1: the same plus m * dx * sum(qx)
    Q4_K, Q5_K: dx * (d*sc * sum(q * qx) - dmin*m * sum(qx)), their nibbles in Q4_0's order
    Q6_K: dx * d * (s_lo * (sum(q * qx) - 32 * sum(qx)) over weights 0-15 + s_hi * the same over 16-31)

Q5_K's and Q6_K's bits above the nibble (a plane after the nibbles, docs/quantized.md) are merged into each word's
bytes in registers first, so dp4a multiplies whole 5- and 6-bit integers. The activations come from
quantize_activation.py's pass or, where the launch says so (GemvConfig.own_int8), from each tile rounding x itself
with its arithmetic (_own_blocks); tuning picks per shape (docs/quantized.md, experiments/own_int8_ab_*.txt). At
7B on an H100 dp4a runs the Q4_0 GEMVs at 60-86% of copy bandwidth against 40-63% unpacking each weight to fp32,
Q8_0 at 76-101% against 68-96% (scripts/experiments/dp4a_gemv.txt)."""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .counters import wait_count
from .dp4a import byte_sums, q4_dot, q8_dot, u8_dot
from .gemv_blocks import block_scales
from .gemv_kquants import k_scales
from .quantize_activation import int8_blocks, workspace_parts


@triton.jit
def dot_int8(w_ptr, w2_ptr, s_ptr, s2_ptr, x_ptr, g_ptr, rows, row_mask, K, stride_wn,
             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NORM: tl.constexpr, PAIR: tl.constexpr,
             EVEN_K: tl.constexpr, FMT: tl.constexpr, PDL: tl.constexpr,
             wait_ptr=None, wait_target=0, watchdog_ptr=None, WAIT: tl.constexpr = False, STAGES: tl.constexpr = 0):
    """dot_rows for FMT 3 (Q8_0), 4 (Q4_0), 5 (Q4_1), 6-8 (Q4_K, Q5_K, Q6_K), x the int8 workspace (with sum(x^2)
    when NORM) or x itself (float, times g when NORM), which each tile rounds to those int8 blocks (_own_blocks).
    The persistent kernel's tasks (decode_step.py) WAIT on its counter after reading their first tile, as a PDL
    launch waits for the kernel before it, and with STAGES > 1 copy the later tiles that far ahead to shared
    memory (Triton's software pipeline)."""
    NB: tl.constexpr = BLOCK_K // 32
    C: tl.constexpr = BLOCK_K // 4 if FMT == 3 else BLOCK_K // 8  # weight words per tile row
    offs = rows[:, None].to(tl.int64) * stride_wn
    w_rows, w2_rows = w_ptr + offs, w2_ptr + offs
    acc, acc2 = tl.zeros((BLOCK_N, NB), dtype=tl.float32), tl.zeros((BLOCK_N, NB), dtype=tl.float32)
    ss = tl.zeros((NB,), dtype=tl.float32)
    start = 0
    if PDL or WAIT:  # the first weight tile is read while x is still being written (gemv._first_tile)
        if PDL:
            gdc_launch_dependents()
        w = _words(w_rows, 0, K, row_mask, EVEN_K, C, FMT)
        w2 = w
        if PAIR:
            w2 = _words(w2_rows, 0, K, row_mask, EVEN_K, C, FMT)
        if PDL:
            gdc_wait()
        else:
            wait_count(wait_ptr, wait_target, watchdog_ptr)
        acc, acc2, ss = _tile(w, w2, s_ptr, s2_ptr, rows, x_ptr, g_ptr, 0, K, row_mask, acc, acc2, ss, BLOCK_N,
                              BLOCK_K, NORM, PAIR, EVEN_K, FMT)
        start = BLOCK_K
    if STAGES > 1:
        for k0 in tl.range(start, K, BLOCK_K, num_stages=STAGES):
            acc, acc2, ss = _loaded_tile(w_rows, w2_rows, s_ptr, s2_ptr, rows, x_ptr, g_ptr, k0, K, row_mask, acc,
                                         acc2, ss, BLOCK_N, BLOCK_K, NORM, PAIR, EVEN_K, FMT)
    else:
        for k0 in range(start, K, BLOCK_K):
            acc, acc2, ss = _loaded_tile(w_rows, w2_rows, s_ptr, s2_ptr, rows, x_ptr, g_ptr, k0, K, row_mask, acc,
                                         acc2, ss, BLOCK_N, BLOCK_K, NORM, PAIR, EVEN_K, FMT)
    return tl.sum(acc, axis=1), tl.sum(acc2, axis=1), tl.sum(ss, axis=0)


@triton.jit
def _loaded_tile(w_rows, w2_rows, s_ptr, s2_ptr, rows, x_ptr, g_ptr, k0, K, row_mask, acc, acc2, ss,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NORM: tl.constexpr, PAIR: tl.constexpr,
                 EVEN_K: tl.constexpr, FMT: tl.constexpr):
    """The tile at k0, its weight words loaded here (not carried from step to step), added as _tile adds it."""
    C: tl.constexpr = BLOCK_K // 4 if FMT == 3 else BLOCK_K // 8
    w = _words(w_rows, k0, K, row_mask, EVEN_K, C, FMT)
    w2 = w
    if PAIR:
        w2 = _words(w2_rows, k0, K, row_mask, EVEN_K, C, FMT)
    return _tile(w, w2, s_ptr, s2_ptr, rows, x_ptr, g_ptr, k0, K, row_mask, acc, acc2, ss, BLOCK_N, BLOCK_K, NORM,
                 PAIR, EVEN_K, FMT)


@triton.jit
def _words(w_rows, k0, K, row_mask, EVEN_K: tl.constexpr, C: tl.constexpr, FMT: tl.constexpr):
    """The (BLOCK_N, C) weight words of the tile at k0 from the rows' first bytes w_rows: as stored, or for Q5_K and
    Q6_K a pair of words (low nibbles', high nibbles') with the plane's bits merged in."""
    word = (k0 // 4 if FMT == 3 else k0 // 8) + tl.arange(0, C)
    mask = row_mask[:, None] if EVEN_K else row_mask[:, None] & (word < (K // 4 if FMT == 3 else K // 8))[None, :]
    w = tl.load(w_rows.to(tl.pointer_type(tl.int32), bitcast=True) + word[None, :], mask=mask, other=0,
                eviction_policy="evict_first")
    if FMT >= 7:  # one plane byte (Q5_K) or two (Q6_K) per nibble word
        plane = w_rows + K // 2
        if FMT == 7:
            h = tl.load(plane + word[None, :], mask=mask, other=0, eviction_policy="evict_first").to(tl.int32)
        else:
            h = tl.load(plane.to(tl.pointer_type(tl.int16), bitcast=True) + word[None, :], mask=mask, other=0,
                        eviction_policy="evict_first").to(tl.int32) & 0xFFFF
        w = _merged(w, h, FMT)
    return w


@triton.jit
def _merged(w, h, FMT: tl.constexpr):
    """Nibble words w and their plane bits h -> (low, high) words of whole 5-bit (Q5_K) or 6-bit (Q6_K) integers.
    Q5_K: bit 2i of h is byte i's low weight's fifth bit (2i + 1 its high one's); times 2^4 + 2^10 + 2^16 + 2^22 the
    four even bits move from 2i to 8i + 4 (other products land on bits the mask drops, no carry into a kept bit).
    Q6_K: bits 4i..4i+3 of h, byte i's two pairs of fifth and sixth bits, spread to a nibble per byte, shifted."""
    lo, hi = w & 0x0F0F0F0F, (w >> 4) & 0x0F0F0F0F
    if FMT == 7:
        return lo | (((h & 0x55) * 0x410410) & 0x10101010), hi | ((((h >> 1) & 0x55) * 0x410410) & 0x10101010)
    h = (h | (h << 8)) & 0x00FF00FF
    h = (h | (h << 4)) & 0x0F0F0F0F
    return lo | ((h & 0x03030303) << 4), hi | ((h & 0x0C0C0C0C) << 2)


@triton.jit
def _tile(w, w2, s_ptr, s2_ptr, rows, x_ptr, g_ptr, k0, K, row_mask, acc, acc2, ss, BLOCK_N: tl.constexpr,
          BLOCK_K: tl.constexpr, NORM: tl.constexpr, PAIR: tl.constexpr, EVEN_K: tl.constexpr, FMT: tl.constexpr):
    """The tile at k0 of the weight words w (and w2) added to acc (acc2), its blocks' sum(x^2) to ss."""
    NB: tl.constexpr = BLOCK_K // 32
    C: tl.constexpr = BLOCK_K // 4 if FMT == 3 else BLOCK_K // 8
    bk = k0 // 32 + tl.arange(0, NB)
    if x_ptr.dtype.element_ty == tl.int8:
        xa, xb, dx, xs, ss_tile = _workspace_blocks(x_ptr, k0, K, bk, NB, C, NORM, FMT)
    else:
        xa, xb, dx, xs, ss_tile = _own_blocks(x_ptr, g_ptr, k0, K, NB, NORM, EVEN_K, FMT)
    if FMT == 8:  # Q6_K scales each half of a block: the sums of the activations of each
        xs = (tl.sum(tl.reshape(byte_sums(xa), (NB, C // NB)), axis=1),
              tl.sum(tl.reshape(byte_sums(xb), (NB, C // NB)), axis=1))
    if NORM:
        ss += ss_tile
    acc += _blocks(w, s_ptr, rows, bk, xa, xb, dx, xs, row_mask, K, BLOCK_N, NB, C, EVEN_K, FMT)
    if PAIR:
        acc2 += _blocks(w2, s2_ptr, rows, bk, xa, xb, dx, xs, row_mask, K, BLOCK_N, NB, C, EVEN_K, FMT)
    return acc, acc2, ss


@triton.jit
def _workspace_blocks(x_ptr, k0, K, bk, NB: tl.constexpr, C: tl.constexpr, NORM: tl.constexpr, FMT: tl.constexpr):
    """From quantize_activation.py's workspace: the tile's activation words (xa: a Q4 word's low nibbles', xb: its
    high ones'), block scales, block sums of q and of x^2 (NORM)."""
    xq_ptr, dx_ptr, xs_ptr, ss_ptr = workspace_parts(x_ptr, K)
    c = tl.arange(0, C)
    bmask = bk < K // 32
    xw = k0 // 4 + c if FMT == 3 else k0 // 4 + (c // 4) * 8 + c % 4  # Q4: the low nibbles' activation word
    cmask = (k0 // 4 + c < K // 4) if FMT == 3 else (k0 // 8 + c < K // 8)
    xa = tl.load(xq_ptr + xw, mask=cmask, other=0)
    xb = xa
    if FMT != 3:
        xb = tl.load(xq_ptr + xw + 4, mask=cmask, other=0)
    ss = tl.zeros((NB,), dtype=tl.float32)
    if NORM:
        ss = tl.load(ss_ptr + bk, mask=bmask, other=0.0)
    xs = tl.zeros((NB,), dtype=tl.int32)
    if FMT != 8:  # Q6_K sums each half's activations itself (_tile)
        xs = tl.load(xs_ptr + bk, mask=bmask, other=0)
    return xa, xb, tl.load(dx_ptr + bk, mask=bmask, other=0.0), xs, ss


@triton.jit
def _own_blocks(x_ptr, g_ptr, k0, K, NB: tl.constexpr, NORM: tl.constexpr, EVEN_K: tl.constexpr, FMT: tl.constexpr):
    """_workspace_blocks' values from x (times g) in registers, by quantize_activation.py's arithmetic, in the
    workspace's word order: every program rounds its tile again, ALU where a pass costs a launch (own_int8)."""
    k = k0 + tl.arange(0, NB * 32)
    kmask = k < K if not EVEN_K else tl.full(k.shape, True, tl.int1)
    v = tl.reshape(tl.load(x_ptr + k, mask=kmask, other=0.0).to(tl.float32), (NB, 32))
    ss = tl.zeros((NB,), dtype=tl.float32)
    if NORM:
        ss = tl.sum(v * v, axis=1)
        v = v * tl.reshape(tl.load(g_ptr + k, mask=kmask, other=0.0).to(tl.float32), (NB, 32))
    q, dx = int8_blocks(v)
    shifts = (8 * tl.arange(0, 4))[None, None, :]
    words = tl.sum((tl.reshape(q, (NB, 8, 4)) & 0xFF) << shifts, axis=2)  # disjoint bytes: the sum is their OR
    if FMT == 3:
        xa = tl.reshape(words, (NB * 8,))
        xb = xa
    else:  # a block's words 0-3 meet the low nibbles, 4-7 the high ones
        xa, xb = tl.split(tl.permute(tl.reshape(words, (NB, 2, 4)), (0, 2, 1)))
        xa, xb = tl.reshape(xa, (NB * 4,)), tl.reshape(xb, (NB * 4,))
    return xa, xb, dx, tl.sum(q, axis=1), ss


@triton.jit
def _blocks(w, s_ptr, rows, bk, xa, xb, dx, xs, row_mask, K, BLOCK_N: tl.constexpr, NB: tl.constexpr,
            C: tl.constexpr, EVEN_K: tl.constexpr, FMT: tl.constexpr):
    """One tile's (BLOCK_N, NB) scaled block products; w a word pair for Q5_K, Q6_K (_merged), xs (Q6_K: halves')."""
    xa, xb = tl.broadcast_to(xa[None, :], (BLOCK_N, C)), tl.broadcast_to(xb[None, :], (BLOCK_N, C))
    if FMT >= 6:
        smask = row_mask[:, None] if EVEN_K else row_mask[:, None] & (bk < K // 32)[None, :]
        s_lo, s_hi, m = k_scales(s_ptr, rows, bk, K, smask, FMT)
    if FMT == 8:
        lo = tl.sum(tl.reshape(u8_dot(w[0], xa), (BLOCK_N, NB, C // NB)), axis=2) - 32 * xs[0][None, :]
        hi = tl.sum(tl.reshape(u8_dot(w[1], xb), (BLOCK_N, NB, C // NB)), axis=2) - 32 * xs[1][None, :]
        part = (lo.to(tl.float32) * s_lo + hi.to(tl.float32) * s_hi) * dx[None, :]
    elif FMT >= 6:  # Q4_K, Q5_K: Q4_1's sums, with the scale d*sc and the min -dmin*m of each block's 6-bit pair
        p = u8_dot(w[0], xa) + u8_dot(w[1], xb) if FMT == 7 else q4_dot(w, xa, xb)
        isum = tl.sum(tl.reshape(p, (BLOCK_N, NB, C // NB)), axis=2)
        part = (isum.to(tl.float32) * s_lo - m * xs.to(tl.float32)[None, :]) * dx[None, :]
    else:
        part = _blocks_32(w, s_ptr, rows, bk, xa, xb, dx, xs, row_mask, K, BLOCK_N, NB, C, EVEN_K, FMT)
    return part


@triton.jit
def _blocks_32(w, s_ptr, rows, bk, xa, xb, dx, xs, row_mask, K, BLOCK_N: tl.constexpr, NB: tl.constexpr,
               C: tl.constexpr, EVEN_K: tl.constexpr, FMT: tl.constexpr):
    """_blocks for the formats with an fp16 scale per 32 weights: Q8_0, Q4_0, Q4_1."""
    p = q8_dot(w, xa) if FMT == 3 else q4_dot(w, xa, xb)
    isum = tl.sum(tl.reshape(p, (BLOCK_N, NB, C // NB)), axis=2)
    if FMT == 4:
        isum -= 8 * xs[None, :]
    scale_rows = s_ptr + rows[:, None].to(tl.int64) * (K // 32 * (2 if FMT == 5 else 1))  # Q4_1: (scale, min)
    d = block_scales(scale_rows, bk, K, row_mask, EVEN_K, FMT == 5, 0)
    part = isum.to(tl.float32) * d * dx[None, :]
    if FMT == 5:
        part += block_scales(scale_rows, bk, K, row_mask, EVEN_K, True, 1) * (dx * xs.to(tl.float32))[None, :]
    return part
