"""A decode GEMV's input as int8 blocks, for block-format weights (llama.cpp's Q8_1 activations).

    d = amax(|v|) / 127 per block of 32;  q = round(v / d);  v = x * g (RMSNorm's weight, when the op norms) or x

Their GEMVs then multiply 4 weights by 4 activations per instruction (dp4a, gemv_int8.py) and convert one integer
sum per block to a float, where unpacking every weight to fp32 kept them at 39-64% of copy bandwidth at 7B
(scripts/experiments/dp4a_gemv.txt). RMSNorm's scale is one number per row, applied to the GEMV's row sums, so the
statistic sum(x^2) travels beside the blocks, one partial sum per block (the GEMV adds them up as it walks K).

Where its launch says so (GemvConfig.own_int8), the GEMV rounds x itself instead, with this arithmetic
(gemv_int8._own_blocks), and this pass is not launched.

The workspace, one int8 tensor: q (K bytes) | d (K/32 fp32) | sum of q per block (K/32 int32) | sum(x^2) per
block (K/32 fp32, when the op norms).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from llamafast.config import QK, Weight

from ._common import INTERPRET, pdl_capable

if TYPE_CHECKING:
    from .gemv import GemvConfig

_ASM = tl.constexpr(not INTERPRET)


@triton.jit
def workspace_parts(ws_ptr, K):
    """Pointers to the workspace's (q as int32 words, d, block sums of q, block sums of x^2)."""
    q = ws_ptr.to(tl.pointer_type(tl.int32), bitcast=True)
    d = (ws_ptr + K).to(tl.pointer_type(tl.float32), bitcast=True)
    s = (ws_ptr + K + 4 * (K // 32)).to(tl.pointer_type(tl.int32), bitcast=True)
    ss = (ws_ptr + K + 8 * (K // 32)).to(tl.pointer_type(tl.float32), bitcast=True)
    return q, d, s, ss


@triton.jit
def rint(v):
    """v rounded to the nearest integer, ties to even (torch.round), as int32."""
    if _ASM:
        return tl.inline_asm_elementwise("cvt.rni.s32.f32 $0, $1;", "=r,r", [v], dtype=tl.int32, is_pure=True,
                                         pack=1)
    return ((v + 12582912.0) - 12582912.0).to(tl.int32)  # 1.5 * 2**23: exact for |v| < 2**22


@triton.jit
def int8_blocks(v):
    """v (NB, 32) fp32 -> (q (NB, 32) int32, d (NB,) fp32): d = amax(|v|) / 127 per block, q = round(v / d) by
    the reciprocal, 0 for a block of zeros. The one rounding of the pass below and of the GEMVs that round their
    own input (gemv_int8._own_blocks)."""
    amax = tl.max(tl.abs(v), axis=1)
    inv = tl.where(amax > 0, tl.math.div_rn(tl.full(amax.shape, 127.0, tl.float32), amax), 0.0)
    return rint(v * inv[:, None]), tl.math.div_rn(amax, tl.full(amax.shape, 127.0, tl.float32))


@triton.jit
def _quantize_activation_kernel(x_ptr, g_ptr, ws_ptr, K, NORM: tl.constexpr, BLOCK: tl.constexpr,
                                PDL: tl.constexpr):
    """BLOCK // 32 blocks of x per program. PDL: launched while the kernel that writes x still runs, it lets the
    GEMV after it start reading weights (gemv_int8.py) and waits for x."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    _, d_ptr, s_ptr, ss_ptr = workspace_parts(ws_ptr, K)
    k = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    b = tl.program_id(0) * (BLOCK // 32) + tl.arange(0, BLOCK // 32)
    v = tl.reshape(tl.load(x_ptr + k, mask=k < K, other=0.0).to(tl.float32), (BLOCK // 32, 32))
    if NORM:
        tl.store(ss_ptr + b, tl.sum(v * v, axis=1), mask=b < K // 32)
        v = v * tl.reshape(tl.load(g_ptr + k, mask=k < K, other=0.0).to(tl.float32), (BLOCK // 32, 32))
    q, d = int8_blocks(v)
    tl.store(ws_ptr + k, tl.reshape(q, (BLOCK,)).to(tl.int8), mask=k < K)
    tl.store(d_ptr + b, d, mask=b < K // 32)
    tl.store(s_ptr + b, tl.sum(q, axis=1), mask=b < K // 32)


# Blocks per program: one program walking the whole vector took 3.2 us at K = 4096 and 6.4 at 11008 on an H100
# (scripts/experiments/dp4a_gemv.txt's first run); 8 blocks per one-warp program spread it over a wave.
_BLOCK = 256


def int8_activation(x: torch.Tensor, norm_w: torch.Tensor | None = None) -> torch.Tensor:
    """x (1, K) (times norm_w) as the int8 workspace above; K a multiple of 32."""
    k = x.shape[-1]
    assert k % QK == 0, "int8 activations: whole blocks of 32"
    ws = torch.empty(k + 12 * (k // QK), dtype=torch.int8, device=x.device)
    pdl = pdl_capable(x.device)
    _quantize_activation_kernel[(triton.cdiv(k, _BLOCK),)](x, norm_w if norm_w is not None else x, ws, k,
                                                           NORM=norm_w is not None, BLOCK=_BLOCK, PDL=pdl,
                                                           launch_pdl=pdl, num_warps=1)
    return ws


def gemv_input(x: torch.Tensor, w: Weight, cfg: GemvConfig, norm_w: torch.Tensor | None = None) -> torch.Tensor:
    """What a decode GEMV of w launched with cfg reads as its input: int8 blocks of x (times norm_w) where w takes
    them (Weight.int8_activations) from a pass before it, else x itself (float weights; cfg.own_int8: the GEMV
    rounds x itself; cfg.float_blocks: it multiplies float x). gemv.dot_rows tells them apart by the pointer's
    dtype and FLOAT_BLOCKS."""
    return int8_activation(x, norm_w) if w.int8_activations and not (cfg.own_int8 or cfg.float_blocks) else x
