"""Reading Q8_0, Q4_0 and Q4_1 blocks (W_FP8 3-5; layout in docs/quantized.md) in registers: their fp16 scales
(gemv_int8.py's decode GEMVs), and nibbles as floats (gemv_kquants.k_floats, for the dequantizers)."""

from __future__ import annotations

import triton
import triton.language as tl

from ._common import INTERPRET


@triton.jit
def block_scales(scale_rows, kb, K, row_mask, EVEN_K: tl.constexpr, PAIRED: tl.constexpr, SECOND: tl.constexpr):
    """(BLOCK_N, NB) fp32: the tile's blocks' scales (PAIRED: Q4_1's (scale, min) pairs, SECOND: the min)."""
    mask = row_mask[:, None] if EVEN_K else row_mask[:, None] & (kb < K // 32)[None, :]
    return tl.load(scale_rows + (2 * kb + SECOND if PAIRED else kb)[None, :], mask=mask, other=0.0).to(tl.float32)


# Integers to floats without the conversion instruction, which runs at 16 per clock per SM on Hopper (a quarter of
# the float rate) and capped float-activation Q4 decode GEMVs near 42% of copy bandwidth at 7B: one prmt per weight puts its byte under
# the exponent of 2**23 (the float 2**23 + v), one sub.f32 takes that bias away, exactly; four weights share each
# 32-bit register, so masks and shifts cost one instruction per four (Q8_0) or eight (Q4) weights. Inline PTX, so
# the interpreter (no PTX) converts as usual: the same values.
def _placed(first: int, reg: str, bias: str) -> str:
    """Bytes 0-3 of reg as floats less bias into outputs $first..$first+3."""
    return "".join(f"prmt.b32 ${first + i}, {reg}, 0x4B000000, 0x754{i}; sub.f32 ${first + i}, ${first + i}, {bias};"
                   for i in range(4))


_ASM = tl.constexpr(not INTERPRET)
_NIBBLES = "{ .reg .b32 l, h; and.b32 l, $8, 0x0F0F0F0F; shr.u32 h, $8, 4; and.b32 h, h, 0x0F0F0F0F; "
_Q4_0_ASM = tl.constexpr(_NIBBLES + _placed(0, "l", "0f4B000008") + _placed(4, "h", "0f4B000008") + " }")
_Q4_1_ASM = tl.constexpr(_NIBBLES + _placed(0, "l", "0f4B000000") + _placed(4, "h", "0f4B000000") + " }")


@triton.jit
def nibble_floats(q, MINUS_8: tl.constexpr):
    """A uint8 tile's (low, high) nibbles as fp32, less 8 (Q4_0's weights) where MINUS_8."""
    if _ASM:
        asm: tl.constexpr = _Q4_0_ASM if MINUS_8 else _Q4_1_ASM
        return tl.inline_asm_elementwise(asm, "=r,=r,=r,=r,=r,=r,=r,=r,r", [q], dtype=(tl.float32, tl.float32),
                                         is_pure=True, pack=4)
    return (q & 0x0F).to(tl.float32) - 8.0 * MINUS_8, (q >> 4).to(tl.float32) - 8.0 * MINUS_8
