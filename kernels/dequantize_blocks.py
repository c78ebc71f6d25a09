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
def _dequantize_kernel(w_ptr, s_ptr, out_ptr, N, K, stride_wn, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       FMT: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = tl.program_id(1) * BLOCK_K
    rmask = (rows < N)[:, None]
    row_ptrs = w_ptr + rows[:, None].to(tl.int64) * stride_wn
    out_rows = out_ptr + rows[:, None].to(tl.int64) * K
    if FMT == 3:
        k = k0 + tl.arange(0, BLOCK_K)
        mask = rmask & (k < K)[None, :]
        w = tl.load(row_ptrs + k[None, :], mask=mask, other=0).to(tl.float32)
        s = tl.load(s_ptr + rows[:, None].to(tl.int64) * (K // 32) + (k // 32)[None, :], mask=mask, other=0.0)
        tl.store(out_rows + k[None, :], (w * s.to(tl.float32)).to(out_ptr.dtype.element_ty), mask=mask)
    elif FMT >= 6:  # the K-quants: their integers and each block's scales and min (gemv_kquants)
        HALF: tl.constexpr = BLOCK_K // 2
        NB: tl.constexpr = BLOCK_K // 32
        c = tl.arange(0, HALF)
        low = k0 + (c // 16) * 32 + c % 16  # the weight a byte's low nibble holds
        mask = rmask & (low < K)[None, :]
        lo, hi = k_floats(row_ptrs, k0 // 2, K, rows < N, False, FMT, BLOCK_N, HALF)
        bk = k0 // 32 + tl.arange(0, NB)  # each block's scales read once, then spread over its 16 bytes
        s_lo, s_hi, m = k_scales(s_ptr, rows, bk, K, rmask & (bk < K // 32)[None, :], FMT)
        s_lo, s_hi, m = _spread(s_lo, BLOCK_N, NB), _spread(s_hi, BLOCK_N, NB), _spread(m, BLOCK_N, NB)
        tl.store(out_rows + low[None, :], (s_lo * lo - m).to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(out_rows + low[None, :] + 16, (s_hi * hi - m).to(out_ptr.dtype.element_ty), mask=mask)
    else:
        c = tl.arange(0, BLOCK_K // 2)
        low = k0 + (c // 16) * 32 + c % 16  # the weight a byte's low nibble holds
        mask = rmask & (low < K)[None, :]
        q = tl.load(row_ptrs + (k0 // 2 + c)[None, :], mask=mask, other=0)
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


@triton.jit
def _spread(v, BLOCK_N: tl.constexpr, NB: tl.constexpr):
    """(BLOCK_N, NB) per-block values -> (BLOCK_N, NB * 16), one per nibble byte (16 bytes a block)."""
    return tl.reshape(tl.broadcast_to(v[:, :, None], (BLOCK_N, NB, 16)), (BLOCK_N, NB * 16))


def dequantize_blocks(w: Weight, dtype: torch.dtype) -> torch.Tensor:
    """A block-format weight (N, K) as a dense (N, K) tensor of dtype, its tail's rows included."""
    if w.tail is not None:
        return torch.cat([dequantize_blocks(w.head, dtype), dequantize_blocks(w.tail, dtype)])
    n, k = w.shape
    assert w.fmt.is_block and k % w.fmt.block_k == 0, f"{w.fmt.value}: blocks of {w.fmt.block_k} along K"
    out = torch.empty((n, k), device=w.data.device, dtype=dtype)
    _dequantize_kernel[(cdiv(n, BLOCK_N), cdiv(k, BLOCK_K))](
        w.data, w.scale, out, n, k, w.data.stride(0), BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, FMT=w.fmt.code, num_warps=4,
    )
    return out
