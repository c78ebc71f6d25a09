"""RMSNorm + QKV projection + RoPE + KV-cache write for a prompt of M tokens, on tensor cores.

    h = x * rsqrt(mean(x^2) + eps) * g;  qkv = h @ Wqkv.T;  q, k = rope(q), rope(k) at pos + m;  cache[pos + m] = k, v

The prefill counterpart of rmsnorm_qkv_rope.py, in three launches: the rows are normalized by a pre-pass
(rmsnorm_rows.py says why), the tiled matmul (tiles.matmul) writes qkv (M, N) with a plain epilogue,
and a pass per token rotates q and k by the fp32 cos/sin of the token's own position and scatters them:
q to its output, k and v into the cache. The matmul keeps its epilogue plain because every epilogue that
stored into the cache, with or without the rotation, cost it half its speed (H100, 7B, 4000 tokens: 1175-1349
us against 724 us for the contiguous store, and 182-228 us against 100 us at 512 tokens; raw output in
scripts/experiments/qkv_probe.txt), far more than the pass's extra read and write of qkv (2 x M x N x 2 bytes).
Legend: M tokens, C dim, H heads, KVH kv heads, D head_dim, N = (H + 2 KVH) D. Llama-2-7B, M = 512:
51.5 GFLOP, 101 MB of Wqkv in bf16.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from llamafast.config import Weight

from .._common import check_rows, check_vector, next_pow2
from .launcher import Launcher
from .rmsnorm_rows import rmsnorm_rows
from .tiles import TileConfig, matmul

# Row count bound -> matmul launch (`scripts/tune.py prefill`). H100, 7B bf16, the whole op (norm, matmul, pass):
# 112.1 us at 512 tokens and 748.0 us at 4,000 (scripts/results/prefill_kernels_7b.txt, the run of record).
CONFIGS: dict[int, TileConfig] = {
    1024: TileConfig(128, 128, 64, 8, 4),
    4096: TileConfig(128, 256, 64, 8, 4),
}


@triton.jit
def _rope_scatter_kernel(
    qkv_ptr, q_ptr, k_cache_ptr, v_cache_ptr, cos_ptr, sin_ptr, pos_ptr,  # qkv (M, N); q (M, QD); caches; tables
    QD, KVD, stride_ch, stride_cs,
    HEAD_DIM: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_KV: tl.constexpr,
):
    """Token m: q and k rotated by (even, odd) pairs, q to q[m], k and v into the caches at pos + m."""
    m = tl.program_id(0)
    position = tl.load(pos_ptr).to(tl.int32) + m
    row = qkv_ptr + m.to(tl.int64) * (QD + 2 * KVD)
    p = tl.arange(0, BLOCK_Q)  # pair index along q
    mask = p < QD // 2
    a, b = _rotate(row + 2 * p, p % (HEAD_DIM // 2), mask, cos_ptr, sin_ptr, position, HEAD_DIM)
    out = q_ptr + m.to(tl.int64) * QD + 2 * p
    tl.store(out, a.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(out + 1, b.to(q_ptr.dtype.element_ty), mask=mask)
    p = tl.arange(0, BLOCK_KV)  # pair index along k (and v)
    mask = p < KVD // 2
    a, b = _rotate(row + QD + 2 * p, p % (HEAD_DIM // 2), mask, cos_ptr, sin_ptr, position, HEAD_DIM)
    offs = (p // (HEAD_DIM // 2)) * stride_ch + position * stride_cs + 2 * (p % (HEAD_DIM // 2))
    tl.store(k_cache_ptr + offs, a.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(k_cache_ptr + offs + 1, b.to(k_cache_ptr.dtype.element_ty), mask=mask)
    v = row + QD + KVD + 2 * p
    tl.store(v_cache_ptr + offs, tl.load(v, mask=mask), mask=mask)
    tl.store(v_cache_ptr + offs + 1, tl.load(v + 1, mask=mask), mask=mask)


_ROPE_SCATTER = Launcher(_rope_scatter_kernel)


@triton.jit
def _rotate(even_ptrs, pair, mask, cos_ptr, sin_ptr, position, HEAD_DIM: tl.constexpr):
    a = tl.load(even_ptrs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(even_ptrs + 1, mask=mask, other=0.0).to(tl.float32)
    cos = tl.load(cos_ptr + position * (HEAD_DIM // 2) + pair, mask=mask, other=0.0)
    sin = tl.load(sin_ptr + position * (HEAD_DIM // 2) + pair, mask=mask, other=0.0)
    return a * cos - b * sin, a * sin + b * cos


def prefill_qkv_rope(x, norm_w, wqkv: Weight, cos, sin, pos, k_cache, v_cache, eps, configs=None):
    """Same contract as llamafast.reference.rmsnorm_qkv_rope: x (M, C) -> q (M, H, D); caches written at pos.."""
    m, c = x.shape
    n, _ = wqkv.shape
    kvh, smax, d = k_cache.shape
    qd, kvd = n - 2 * kvh * d, kvh * d
    check_rows("x", x, c)
    check_vector("norm_w", norm_w, c)
    check_rows("wqkv", wqkv.data, c)
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(2) == 1, "k and v caches: same layout, D contiguous"
    assert cos.shape == (smax, d // 2) and cos.is_contiguous() and sin.is_contiguous(), "cos/sin: (Smax, D/2)"
    qkv = torch.empty((m, n), device=x.device, dtype=x.dtype)
    matmul(rmsnorm_rows(x, norm_w, eps), wqkv, None, qkv, configs or CONFIGS)
    q = torch.empty((m, qd // d, d), device=x.device, dtype=x.dtype)
    _ROPE_SCATTER[(m,)](
        qkv, q, k_cache, v_cache, cos, sin, pos, qd, kvd, k_cache.stride(0), k_cache.stride(1), HEAD_DIM=d,
        BLOCK_Q=next_pow2(qd // 2), BLOCK_KV=next_pow2(kvd // 2), num_warps=8,
    )
    return q
