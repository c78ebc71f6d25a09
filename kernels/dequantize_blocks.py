"""Block-format weights (Q8_0, Q4_0, Q4_1, the K-quants) to the activations' dtype, for a prompt pass's float matmuls.

A prompt pass is compute-bound, so its matmuls run on tensor cores in the activations' dtype; the weight each one
needs is written out from its blocks just before it runs. One program per (BLOCK_N, BLOCK_K) tile: Q8_0 scales
int8 rows; a Q4 tile's bytes hold weights b*32 + j (low nibble) and b*32 + 16 + j (high) of block b, stored back
in order, as do the K-quants' (their high bits and scales read as gemv_kquants reads them). Reference:
llamafast.quant.dequantize_blocks.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from llamafast.config import Weight

from ._common import cdiv
from .gemv_kquants import k_floats, k_scales

BLOCK_N, BLOCK_K = 16, 256  # a tile of 4,096 weights: 8 blocks of 32 per row


@triton.jit
def _dequantize_kernel(w_ptr, s_ptr, out_ptr, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       FMT: tl.constexpr, BITS: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = tl.program_id(1) * BLOCK_K
    rmask = (rows < N)[:, None]
    out_rows = out_ptr + rows[:, None].to(tl.int64) * K
    if FMT == 3:
        k = k0 + tl.arange(0, BLOCK_K)
        mask = rmask & (k < K)[None, :]
        w = tl.load(w_ptr + rows[:, None].to(tl.int64) * K + k[None, :], mask=mask, other=0).to(tl.float32)
        s = tl.load(s_ptr + rows[:, None].to(tl.int64) * (K // 32) + (k // 32)[None, :], mask=mask, other=0.0)
        tl.store(out_rows + k[None, :], (w * s.to(tl.float32)).to(out_ptr.dtype.element_ty), mask=mask)
    elif FMT >= 6:  # the K-quants: their integers and each block's scales and min (gemv_kquants)
        c = tl.arange(0, BLOCK_K // 2)
        low = k0 + (c // 16) * 32 + c % 16  # the weight a byte's low nibble holds
        mask = rmask & (low < K)[None, :]
        lo, hi = k_floats(w_ptr + rows[:, None].to(tl.int64) * (K * BITS // 8), k0 // 2, K, rows < N, False,
                          FMT, BLOCK_N, BLOCK_K // 2)
        WORDS: tl.constexpr = 9 if FMT == 8 else 10
        s_lo, s_hi, m = k_scales(s_ptr + rows[:, None].to(tl.int64) * (K // 256 * WORDS), low // 32, mask, FMT)
        tl.store(out_rows + low[None, :], (s_lo * lo - m).to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(out_rows + low[None, :] + 16, (s_hi * hi - m).to(out_ptr.dtype.element_ty), mask=mask)
    else:
        c = tl.arange(0, BLOCK_K // 2)
        low = k0 + (c // 16) * 32 + c % 16  # the weight a byte's low nibble holds
        mask = rmask & (low < K)[None, :]
        q = tl.load(w_ptr + rows[:, None].to(tl.int64) * (K // 2) + (k0 // 2 + c)[None, :], mask=mask, other=0)
        lo, hi = (q & 0x0F).to(tl.float32), (q >> 4).to(tl.float32)
        pairs: tl.constexpr = 2 if FMT == 5 else 1
        srow = s_ptr + rows[:, None].to(tl.int64) * (K // 32 * pairs) + (low // 32 * pairs)[None, :]
        d = tl.load(srow, mask=mask, other=0.0).to(tl.float32)
        if FMT == 4:  # Q4_0: d * (q - 8)
            lo, hi = d * (lo - 8.0), d * (hi - 8.0)
        else:  # Q4_1: d * q + m
            m = tl.load(srow + 1, mask=mask, other=0.0).to(tl.float32)
            lo, hi = d * lo + m, d * hi + m
        tl.store(out_rows + low[None, :], lo.to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(out_rows + low[None, :] + 16, hi.to(out_ptr.dtype.element_ty), mask=mask)


def dequantize_blocks(w: Weight, dtype: torch.dtype) -> torch.Tensor:
    """A block-format weight (N, K) as a dense (N, K) tensor of dtype."""
    n, k = w.shape
    assert w.fmt.is_block and k % w.fmt.block_k == 0, f"{w.fmt.value}: blocks of {w.fmt.block_k} along K"
    out = torch.empty((n, k), device=w.data.device, dtype=dtype)
    _dequantize_kernel[(cdiv(n, BLOCK_N), cdiv(k, BLOCK_K))](
        w.data, w.scale, out, n, k, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, FMT=w.fmt.code, BITS=w.fmt.bits,
        num_warps=4,
    )
    return out
