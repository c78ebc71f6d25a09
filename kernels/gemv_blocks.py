"""The decode GEMV's loop for block-format weights (gemv.dot_rows with W_FP8 3 Q8_0, 4 Q4_0, 5 Q4_1; layout in
llamafast/load/blocks.py and docs/quantized.md): blocks of 32 weights with fp16 scales, kept as stored and
dequantized in registers. The per-op kernels' path only: the persistent decode step refuses block weights."""

from __future__ import annotations

import triton
import triton.language as tl

from ._common import INTERPRET
from .gemv_tiles import activation


@triton.jit
def dot_blocks(w_ptr, w2_ptr, s_ptr, s2_ptr, x_ptr, g_ptr, p_ptr, xo_ptr, rows, row_mask, K, stride_wn,
               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NORM: tl.constexpr, PAIR: tl.constexpr,
               EVEN_K: tl.constexpr, FMT: tl.constexpr, PARTS: tl.constexpr):
    """dot_rows for blocks of 32 weights with fp16 scales (BLOCK_K a multiple of 32), each block's products summed
    and then scaled once. Q8_0 reads (BLOCK_N, BLOCK_K) int8 tiles; a Q4 tile is (BLOCK_N, BLOCK_K / 2) bytes as
    stored: byte j of block b holds weights b*32 + j (low nibble) and b*32 + 16 + j (high), so x is loaded at
    those two index sets instead of the weights being reordered."""
    NB: tl.constexpr = BLOCK_K // 32
    offs = rows[:, None].to(tl.int64) * stride_wn
    acc, acc2 = tl.zeros((BLOCK_N, NB), dtype=tl.float32), tl.zeros((BLOCK_N, NB), dtype=tl.float32)
    soffs = rows[:, None].to(tl.int64) * (K // 32 * (2 if FMT == 5 else 1))  # Q4_1: (scale, min) pairs
    kb = tl.arange(0, NB)
    if FMT == 3:
        ss = tl.zeros((BLOCK_K,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            x, ss = activation(x_ptr, g_ptr, p_ptr, xo_ptr, ss, k, K, NORM, EVEN_K, PARTS)
            acc += _q8_blocks(w_ptr + offs, s_ptr + soffs, k, k0 // 32 + kb, x, K, row_mask, EVEN_K, BLOCK_N, NB)
            if PAIR:
                acc2 += _q8_blocks(w2_ptr + offs, s2_ptr + soffs, k, k0 // 32 + kb, x, K, row_mask, EVEN_K, BLOCK_N, NB)
    else:
        ss = tl.zeros((BLOCK_K // 2,), dtype=tl.float32)
        c = tl.arange(0, BLOCK_K // 2)  # byte within the tile
        low = (c // 16) * 32 + c % 16  # the weight its low nibble holds
        for k0 in range(0, K, BLOCK_K):
            xl, ss = activation(x_ptr, g_ptr, p_ptr, xo_ptr, ss, k0 + low, K, NORM, EVEN_K, PARTS)
            xh, ss = activation(x_ptr, g_ptr, p_ptr, xo_ptr, ss, k0 + low + 16, K, NORM, EVEN_K, PARTS)
            xsum = tl.sum(tl.reshape(xl + xh, (NB, 16)), axis=1)  # each block's activations, for Q4_1's min
            b, bk = k0 // 2 + c, k0 // 32 + kb
            acc += _q4_blocks(w_ptr + offs, s_ptr + soffs, b, bk, xl, xh, xsum, K, row_mask, EVEN_K, FMT, BLOCK_N, NB)
            if PAIR:
                acc2 += _q4_blocks(w2_ptr + offs, s2_ptr + soffs, b, bk, xl, xh, xsum, K, row_mask, EVEN_K, FMT,
                                   BLOCK_N, NB)
    return tl.sum(acc, axis=1), tl.sum(acc2, axis=1), tl.sum(ss, axis=0)


@triton.jit
def block_scales(scale_rows, kb, K, row_mask, EVEN_K: tl.constexpr, PAIRED: tl.constexpr, SECOND: tl.constexpr):
    """(BLOCK_N, NB) fp32: the tile's blocks' scales (PAIRED: Q4_1's (scale, min) pairs, SECOND: the min)."""
    mask = row_mask[:, None] if EVEN_K else row_mask[:, None] & (kb < K // 32)[None, :]
    return tl.load(scale_rows + (2 * kb + SECOND if PAIRED else kb)[None, :], mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _q8_blocks(row_ptrs, scale_rows, k, kb, x, K, row_mask, EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr,
               NB: tl.constexpr):
    """A Q8_0 tile times x: each block's sum of int8 * x, times its scale, (BLOCK_N, NB)."""
    mask = row_mask[:, None] if EVEN_K else row_mask[:, None] & (k < K)[None, :]
    w = tl.load(row_ptrs + k[None, :], mask=mask, other=0, eviction_policy="evict_first")
    part = tl.sum(tl.reshape(_int8_floats(w) * x[None, :], (BLOCK_N, NB, 32)), axis=2)
    return part * block_scales(scale_rows, kb, K, row_mask, EVEN_K, False, 0)


# Integers to floats without the conversion instruction, which runs at 16 per clock per SM on Hopper (a quarter of
# the float rate) and capped the Q4 GEMVs near 42% of copy bandwidth at 7B: one prmt per weight puts its byte under
# the exponent of 2**23 (the float 2**23 + v), one sub.f32 takes that bias away, exactly; four weights share each
# 32-bit register, so masks and shifts cost one instruction per four (Q8_0) or eight (Q4) weights. Inline PTX, so
# the interpreter (no PTX) converts as usual: the same values.
def _placed(first: int, reg: str, bias: str) -> str:
    """Bytes 0-3 of reg as floats less bias into outputs $first..$first+3."""
    return "".join(f"prmt.b32 ${first + i}, {reg}, 0x4B000000, 0x754{i}; sub.f32 ${first + i}, ${first + i}, {bias};"
                   for i in range(4))


_ASM = tl.constexpr(not INTERPRET)
_Q8_ASM = tl.constexpr("{ .reg .b32 t; xor.b32 t, $4, 0x80808080; " + _placed(0, "t", "0f4B000080") + " }")
_NIBBLES = "{ .reg .b32 l, h; and.b32 l, $8, 0x0F0F0F0F; shr.u32 h, $8, 4; and.b32 h, h, 0x0F0F0F0F; "
_Q4_0_ASM = tl.constexpr(_NIBBLES + _placed(0, "l", "0f4B000008") + _placed(4, "h", "0f4B000008") + " }")
_Q4_1_ASM = tl.constexpr(_NIBBLES + _placed(0, "l", "0f4B000000") + _placed(4, "h", "0f4B000000") + " }")


@triton.jit
def _int8_floats(w):
    """An int8 tile as fp32."""
    if _ASM:
        return tl.inline_asm_elementwise(_Q8_ASM, "=r,=r,=r,=r,r", [w], dtype=tl.float32, is_pure=True, pack=4)
    return w.to(tl.float32)


@triton.jit
def nibble_floats(q, MINUS_8: tl.constexpr):
    """A uint8 tile's (low, high) nibbles as fp32, less 8 (Q4_0's weights) where MINUS_8."""
    if _ASM:
        asm: tl.constexpr = _Q4_0_ASM if MINUS_8 else _Q4_1_ASM
        return tl.inline_asm_elementwise(asm, "=r,=r,=r,=r,=r,=r,=r,=r,r", [q], dtype=(tl.float32, tl.float32),
                                         is_pure=True, pack=4)
    return (q & 0x0F).to(tl.float32) - 8.0 * MINUS_8, (q >> 4).to(tl.float32) - 8.0 * MINUS_8


@triton.jit
def _q4_blocks(row_ptrs, scale_rows, b, kb, xl, xh, xsum, K, row_mask, EVEN_K: tl.constexpr, FMT: tl.constexpr,
               BLOCK_N: tl.constexpr, NB: tl.constexpr):
    """A Q4 tile times x, (BLOCK_N, NB): per block d * sum (q - 8) x (Q4_0) or d * sum q*x + m * sum x (Q4_1)."""
    mask = row_mask[:, None] if EVEN_K else row_mask[:, None] & (b < K // 2)[None, :]
    q = tl.load(row_ptrs + b[None, :], mask=mask, other=0, eviction_policy="evict_first")
    lo, hi = nibble_floats(q, FMT == 4)
    part = tl.sum(tl.reshape(lo * xl[None, :] + hi * xh[None, :], (BLOCK_N, NB, 16)), axis=2)
    d = block_scales(scale_rows, kb, K, row_mask, EVEN_K, FMT == 5, 0)
    if FMT == 4:
        return d * part
    return d * part + block_scales(scale_rows, kb, K, row_mask, EVEN_K, True, 1) * xsum[None, :]

