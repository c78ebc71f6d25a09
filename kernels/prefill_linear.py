"""The prompt's remaining matmuls on tensor cores: the output and down projections with their residual add,
and the final RMSNorm + LM head when every position's logits are wanted.

    linear_residual: out = residual + x @ W.T          lm_head: logits = rmsnorm(x) @ W.T in fp32

One kernel; the residual add is a constexpr epilogue, the LM head's norm the tiles.rmsnorm_rows pre-pass.
Legend: M tokens, K in, N out. Llama-2-7B, M = 512: wo 17.2 GFLOP (34 MB in bf16), w2 46.2 GFLOP (90 MB).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .gemv import check_rows, check_vector, fp8_code
from .launcher import Launcher
from .tiles import (
    TileConfig, dot_tiles, launch, operands, rmsnorm_rows, row_scale, tile_config, tile_offsets,
)

# Row count bound -> launch, shared by wo and w2 (scripts/tune_prefill.py; files in scripts/results). H100, 7B
# bf16 at 512 tokens: wo 34.8 us = 493 TFLOP/s and w2 76.9 us = 600 TFLOP/s with TMA loads (tune_prefill.txt),
# 39.7 and 92.6 us with pointer loads (tune_prefill_pointer.txt). From 1,024 rows 128 x 256 tiles: wo 197.5 us and
# w2 480.2 us at 4000 tokens against 248.1 and 614.1 with 128 x 128 (tune_prefill_24c9f7e.txt,
# prefill_kernels_7b_24c9f7e.txt); with QKV's the same, time to first token at 4,000 tokens 102.56 / 101.51 ms
# against 107.28 / 104.96 (tile_ab.txt, tile_abc.txt).
CONFIGS: dict[int, TileConfig] = {
    256: TileConfig(64, 64, 64, 4, 4),
    1024: TileConfig(128, 128, 64, 8, 4),
    4096: TileConfig(128, 256, 64, 8, 3),
}


@triton.jit
def _prefill_linear_kernel(
    x_ptr, w_ptr, s_ptr, res_ptr, out_ptr,  # x (M, K), W (N, K), E4M3 scales (N,), residual and out (M, N)
    M, N, K, stride_xm, stride_wn,
    RESIDUAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, W_FP8: tl.constexpr, FP32: tl.constexpr, TMA: tl.constexpr,
):
    off_m, off_n = tile_offsets(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc, _ = dot_tiles(x_ptr, stride_xm, w_ptr, w_ptr, stride_wn, off_m, off_n, M, N, K,
                       BLOCK_M, BLOCK_N, BLOCK_K, False, EVEN_K, W_FP8, FP32, TMA)
    rows, cols = off_m + tl.arange(0, BLOCK_M), off_n + tl.arange(0, BLOCK_N)
    acc = row_scale(acc, s_ptr, cols, N, W_FP8)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    offs = rows[:, None].to(tl.int64) * N + cols[None, :]
    if RESIDUAL:
        acc += tl.load(res_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


_LINEAR = Launcher(_prefill_linear_kernel)


def prefill_linear_residual(x, w, residual, w_scale=None):
    """Same contract as llamafast.reference.linear_residual: x (M, K), residual (M, N) -> (M, N)."""
    m, k = x.shape
    check_rows("x", x, k)
    check_rows("w", w, k)
    assert residual.shape == (m, w.shape[0]) and residual.is_contiguous(), "residual: (M, N) contiguous"
    out = torch.empty_like(residual)
    matmul(x, w, w_scale, residual, out)
    return out


def prefill_lm_head(x, norm_w, w, eps, w_scale=None):
    """Same contract as llamafast.reference.rmsnorm_lm_head: x (M, C) -> logits (M, V) in fp32."""
    m, c = x.shape
    check_rows("x", x, c)
    check_vector("norm_w", norm_w, c)
    check_rows("w", w, c)
    out = torch.empty((m, w.shape[0]), device=x.device, dtype=torch.float32)
    matmul(rmsnorm_rows(x, norm_w, eps), w, w_scale, None, out)
    return out


def matmul(x, w, w_scale, residual, out, configs: dict[int, TileConfig] | None = None) -> None:
    """out = x @ w.T (+ residual): the tiled loop with a plain epilogue, launched with configs (default: CONFIGS)."""
    (m, k), n = x.shape, w.shape[0]
    cfg = tile_config(configs or CONFIGS, m, k, x.element_size())
    run = launch(cfg, m, n)
    (a, wt), tma = operands(x, [w], cfg)
    _LINEAR[run["grid"]](
        a, wt, w if w_scale is None else w_scale, out if residual is None else residual, out, m, n, k, x.stride(0),
        w.stride(0), RESIDUAL=residual is not None, EVEN_K=k % cfg.block_k == 0, W_FP8=fp8_code(w, w_scale),
        FP32=x.dtype == torch.float32, TMA=tma, **run["meta"],
    )
