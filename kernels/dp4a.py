"""dp4a, the instruction the block-format decode GEMVs (gemv_int8.py) multiply with: four byte products of two
32-bit words summed into an int32 in one instruction. Inline PTX on the GPU; the interpreter, which runs no PTX,
takes the same sums byte by byte."""

from __future__ import annotations

import triton
import triton.language as tl

from ._common import INTERPRET

_ASM = tl.constexpr(not INTERPRET)
# One Q4 word holds 8 weights: its low nibbles are 4 consecutive weights of a block, its high ones the 4 that lie
# 16 further on (GGUF's order), so it meets two activation words: (lo, hi) -> dp4a(lo nibbles, xl) + dp4a(hi, xh).
_Q4_DOT = tl.constexpr("{ .reg .b32 l, h; and.b32 l, $1, 0x0F0F0F0F; shr.u32 h, $1, 4; and.b32 h, h, 0x0F0F0F0F; "
                       "dp4a.u32.s32 $0, l, $2, 0; dp4a.u32.s32 $0, h, $3, $0; }")
_Q8_DOT = tl.constexpr("dp4a.s32.s32 $0, $1, $2, 0;")
_U8_DOT = tl.constexpr("dp4a.u32.s32 $0, $1, $2, 0;")
_BYTE_SUMS = tl.constexpr("dp4a.s32.s32 $0, $1, 0x01010101, 0;")


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
def q4_dot(w, xl, xh):
    if _ASM:
        return tl.inline_asm_elementwise(_Q4_DOT, "=r,r,r,r", [w, xl, xh], dtype=tl.int32, is_pure=True, pack=1)
    return _bytes_dot(w & 0x0F0F0F0F, xl, False) + _bytes_dot((w >> 4) & 0x0F0F0F0F, xh, False)


@triton.jit
def q8_dot(w, x):
    if _ASM:
        return tl.inline_asm_elementwise(_Q8_DOT, "=r,r,r", [w, x], dtype=tl.int32, is_pure=True, pack=1)
    return _bytes_dot(w, x, True)


@triton.jit
def u8_dot(w, x):
    """dp4a of unsigned weight bytes (Q5_K's and Q6_K's merged words) and signed activation bytes."""
    if _ASM:
        return tl.inline_asm_elementwise(_U8_DOT, "=r,r,r", [w, x], dtype=tl.int32, is_pure=True, pack=1)
    return _bytes_dot(w, x, False)


@triton.jit
def byte_sums(x):
    """The sum of each activation word's four signed bytes."""
    if _ASM:
        return tl.inline_asm_elementwise(_BYTE_SUMS, "=r,r", [x], dtype=tl.int32, is_pure=True, pack=1)
    return _bytes_dot(tl.full(x.shape, 0x01010101, tl.int32), x, False)
