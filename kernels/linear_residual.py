"""Output projection and down projection with the residual add fused: out = residual + x @ W.T.

Batch-1 decode: x (1, K), W (N, K), residual (1, N). One pass over W; the residual is read and the
output written in the epilogue, so the add costs no extra launch. At Llama-2-7B this is wo (N = K =
4096, 33.6 MB in bf16) and w2 (N = 4096, K = 11008, 90.2 MB).
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from llamafast.config import Weight

from ._common import cdiv, check_vector, check_weight, scale_arg
from .gemv import GemvConfig, dot_rows, gemv_config, launch_args
from .quantize_activation import gemv_input

# (N, K, bytes per weight) -> launch. H100 (scripts/results/tune_7b*.txt): wo 13.8 us = 2438 GB/s and w2 33.8 us
# = 2668 GB/s in bf16; wo 8.4 us = 1999 GB/s and w2 18.9 us = 2386 GB/s in FP8 (E5M2).
CONFIGS: dict[tuple[int, int, int], GemvConfig] = {
    (4096, 4096, 2): GemvConfig(block_n=2, block_k=1024, num_warps=1),
    (4096, 11008, 2): GemvConfig(block_n=2, block_k=1024, num_warps=1),
    (4096, 4096, 1): GemvConfig(block_n=2, block_k=1024, num_warps=1),
    (4096, 11008, 1): GemvConfig(block_n=4, block_k=1024, num_warps=2),
    # Tensor-parallel shards (TP=2 at 7B, 13B and 70B), tuned on one H200 (scripts/results/tp/tune_tp2_*.json):
    (4096, 2048, 2): GemvConfig(block_n=4, block_k=1024, num_warps=2),  # 6.3 us
    (4096, 5504, 2): GemvConfig(block_n=2, block_k=1024, num_warps=1),  # 13.5 us
    (5120, 2560, 2): GemvConfig(block_n=2, block_k=512, num_warps=2),  # 8.9 us
    (5120, 6912, 2): GemvConfig(block_n=2, block_k=1024, num_warps=4),  # 20.0 us
    (8192, 4096, 2): GemvConfig(block_n=4, block_k=512, num_warps=1),  # 18.5 us, 70B
    (8192, 14336, 2): GemvConfig(block_n=2, block_k=1024, num_warps=1),  # 58.2 us, 70B
}
# An H200's own launches, chosen by the whole step of 7B, of 70B in FP8 and of TP=2 shards (kernels.ON_GPU says how).
H200: dict[tuple, GemvConfig] = {
    (4096, 4096, 2): GemvConfig(block_n=4, block_k=1024, num_warps=2),
    (4096, 4096, 1): GemvConfig(block_n=4, block_k=1024, num_warps=4, pdl=True),
    (4096, 11008, 1): GemvConfig(block_n=2, block_k=1024, num_warps=4, pdl=True),
    (8192, 8192, 1): GemvConfig(block_n=4, block_k=512, num_warps=1, pdl=True),  # 70B
    (8192, 28672, 1): GemvConfig(block_n=4, block_k=512, num_warps=1, pdl=True),  # 70B
}
# An H100's own launches, chosen by the whole 7B step (kernels.ON_GPU says how).
H100: dict[tuple, GemvConfig] = {
    (4096, 4096, 2): GemvConfig(block_n=4, block_k=1024, num_warps=2),
    (4096, 4096, 1): dataclasses.replace(CONFIGS[(4096, 4096, 1)], pdl=True),
    (4096, 11008, 1): GemvConfig(block_n=2, block_k=1024, num_warps=4, pdl=True),
    (4096, 4096, "q8_0"): GemvConfig(block_n=8, block_k=2048, num_warps=8, own_int8=True),
    (4096, 11008, "q8_0"): GemvConfig(block_n=8, block_k=2048, num_warps=8, own_int8=True),
}


@triton.jit
def _linear_residual_kernel(
    x_ptr, w_ptr, s_ptr, res_ptr, out_ptr,  # x (K,), W (N, K), E4M3 scales (N,), residual (N,), out (N,)
    N, K, stride_wn,  # sizes; W's row stride
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, W_FP8: tl.constexpr,
    PDL: tl.constexpr = False,  # launched with programmatic dependent launch (gemv.use_pdl)
    FLOAT_BLOCKS: tl.constexpr = False,  # gemv.GemvConfig.float_blocks
):
    linear_residual_tile(tl.program_id(0), x_ptr, w_ptr, s_ptr, res_ptr, out_ptr, N, K, stride_wn, BLOCK_N, BLOCK_K,
                         EVEN_K, W_FP8, PDL, FLOAT_BLOCKS=FLOAT_BLOCKS)


@triton.jit
def linear_residual_tile(
    tile, x_ptr, w_ptr, s_ptr, res_ptr, out_ptr, N, K, stride_wn,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, W_FP8: tl.constexpr, PDL: tl.constexpr = False,
    wait_ptr=None, wait_target=0, watchdog_ptr=None, WAIT: tl.constexpr = False,  # decode_step.py
    PREFETCH: tl.constexpr = 0, FLOAT_BLOCKS: tl.constexpr = False,
):
    """Output rows tile * BLOCK_N ... ."""
    rows = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = rows < N
    acc, _, _ = dot_rows(
        w_ptr, w_ptr, s_ptr, s_ptr, x_ptr, x_ptr, rows, mask, K, stride_wn, BLOCK_N, BLOCK_K, False, False, EVEN_K, W_FP8,
        PDL=PDL, wait_ptr=wait_ptr, wait_target=wait_target, watchdog_ptr=watchdog_ptr, WAIT=WAIT,
        PREFETCH=PREFETCH, FLOAT_BLOCKS=FLOAT_BLOCKS,
    )
    res = tl.load(res_ptr + rows, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + rows, (res + acc).to(out_ptr.dtype.element_ty), mask=mask)


def linear_residual(x: torch.Tensor, w: Weight, residual: torch.Tensor, configs=None):
    """x (1, K), w (N, K) float or FP8, residual (1, N) -> (1, N) = residual + x @ w.T, in x's dtype. configs: the
    model's launch table (default: the committed CONFIGS)."""
    n, k = w.shape
    check_vector("x", x, k)
    check_vector("residual", residual, n)
    check_weight("w", w, k)
    out = torch.empty_like(residual)
    cfg = gemv_config(CONFIGS if configs is None else configs, w)
    grid = (cdiv(n, cfg.block_n),)
    _linear_residual_kernel[grid](
        gemv_input(x, w, cfg), w.data, scale_arg(w), residual, out, n, k, w.data.stride(0),
        **launch_args(cfg, w, pdl=True),
    )
    return out
