"""RMSNorm of a prompt's rows, written out: the pre-pass of the normed prefill matmuls (prefill_qkv_rope,
prefill_swiglu, prefill_lm_head), which then multiply the normalized rows with a plain tl.dot loop.

    h = x * rsqrt(mean(x^2) + eps) * g,  rounded to x's dtype as the reference rounds it

Legend: M tokens, K dim. Llama-2-7B, M = 4000: reads and writes 2 x 32.8 MB in bf16.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._common import next_pow2
from .launcher import Launcher


@triton.jit
def _rmsnorm_rows_kernel(x_ptr, g_ptr, h_ptr, K, stride_xm, eps, BLOCK_K: tl.constexpr):
    """One row: h = x * rsqrt(mean(x^2) + eps) * g, rounded to x's dtype as the reference rounds it."""
    row = tl.program_id(0).to(tl.int64)
    k = tl.arange(0, BLOCK_K)
    ss = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = tl.load(x_ptr + row * stride_xm + k0 + k, mask=k0 + k < K, other=0.0).to(tl.float32)
        ss += x * x
    rstd = tl.rsqrt(tl.sum(ss, axis=0) / K + eps)
    for k0 in range(0, K, BLOCK_K):
        mask = k0 + k < K
        x = tl.load(x_ptr + row * stride_xm + k0 + k, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + k0 + k, mask=mask, other=0.0).to(tl.float32)
        tl.store(h_ptr + row * K + k0 + k, (x * rstd * g).to(h_ptr.dtype.element_ty), mask=mask)


_RMSNORM_ROWS = Launcher(_rmsnorm_rows_kernel)


def rmsnorm_rows(x: torch.Tensor, g: torch.Tensor, eps: float) -> torch.Tensor:
    """The normalized prompt rows (M, K) that the normed prefill matmuls multiply: a pre-pass, not fused into
    their dot loop. At 7B on the H100, QKV + SwiGLU at 512 and 4000 tokens took 4862 us with sum(x^2) and the
    g multiply inside the tl.dot loop, 3335 us with only g inside (the statistic from a pre-pass) and 2897 us
    with this pre-pass writing the rows (scripts/experiments/prefill_norm_modes.txt): touching the A operand in
    registers costs the loop more than the pre-pass's extra 2 x M x K x 2 bytes (16 MB at 4000 tokens)."""
    m, k = x.shape
    h = torch.empty((m, k), device=x.device, dtype=x.dtype)
    _RMSNORM_ROWS[(m,)](x, g, h, k, x.stride(0), eps, BLOCK_K=min(1024, next_pow2(k)), num_warps=4)
    return h
