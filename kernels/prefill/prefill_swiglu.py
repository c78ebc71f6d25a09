"""RMSNorm + SiLU-gated FFN up-projection for a prompt of M tokens, on tensor cores.

    h = x * rsqrt(mean(x^2) + eps) * g;   out = silu(h @ W1.T) * (h @ W3.T)

The prefill counterpart of rmsnorm_swiglu.py: the rows are normalized by a pre-pass (rmsnorm_rows.py says
why), then each program computes the same (BLOCK_M, BLOCK_N) tile of both products from one load of the
activation tile (tiles.dot_tiles with PAIR), so the gate and up outputs never leave registers.
Legend: M tokens, C dim, F hidden. Llama-2-7B, M = 512: 92 GFLOP, 180 MB of W1 and W3 in bf16.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from llamafast.config import Weight

from .._common import check_rows, check_vector, scale_arg, w_fp8
from .launcher import Launcher
from .rmsnorm_rows import rmsnorm_rows
from .tiles import TileConfig, dot_tiles, launch, operands, row_scale, tile_config, tile_offsets

# Row count bound -> launch (`scripts/tune.py prefill`). Two fp32 accumulators per tile: a 128 x 128 tile needs
# 8 warps to hold them. H100, 7B bf16: 150.7 us at 512 tokens and 987.8 us at 4,000
# (scripts/results/prefill_kernels_7b.txt, the run of record).
CONFIGS: dict[int, TileConfig] = {
    4096: TileConfig(128, 128, 64, 8, 4),
}


@triton.jit
def _prefill_swiglu_kernel(
    h_ptr, w1_ptr, w3_ptr, s1_ptr, s3_ptr, out_ptr,  # h (M, C) normalized; W1, W3 (F, C), E4M3 scales (F,); out (M, F)
    M, F, C, stride_hm, stride_wn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr, W_FP8: tl.constexpr, FP32: tl.constexpr, TMA: tl.constexpr,
):
    off_m, off_n = tile_offsets(M, F, BLOCK_M, BLOCK_N, GROUP_M)
    gate, up = dot_tiles(h_ptr, stride_hm, w1_ptr, w3_ptr, stride_wn, off_m, off_n, M, F, C,
                         BLOCK_M, BLOCK_N, BLOCK_K, True, EVEN_K, W_FP8, FP32, TMA)
    rows, cols = off_m + tl.arange(0, BLOCK_M), off_n + tl.arange(0, BLOCK_N)
    gate = row_scale(gate, s1_ptr, cols, F, W_FP8)
    up = row_scale(up, s3_ptr, cols, F, W_FP8)
    out = gate * tl.sigmoid(gate) * up
    mask = (rows < M)[:, None] & (cols < F)[None, :]
    tl.store(out_ptr + rows[:, None].to(tl.int64) * F + cols[None, :], out.to(out_ptr.dtype.element_ty), mask=mask)


_SWIGLU = Launcher(_prefill_swiglu_kernel)


def prefill_swiglu(x, norm_w, w1: Weight, w3: Weight, eps, configs=None):
    """Same contract as llamafast.reference.rmsnorm_swiglu: x (M, C) -> (M, F)."""
    m, c = x.shape
    f = w1.shape[0]
    check_rows("x", x, c)
    check_vector("norm_w", norm_w, c)
    check_rows("w1", w1.data, c)
    assert w3.shape == w1.shape and w3.data.stride() == w1.data.stride(), "w1 and w3: same shape and layout"
    assert w3.fmt == w1.fmt, "w1 and w3: the same weight format"
    out = torch.empty((m, f), device=x.device, dtype=x.dtype)
    h = rmsnorm_rows(x, norm_w, eps)
    cfg = tile_config(configs or CONFIGS, m, c, x.element_size())
    run = launch(cfg, m, f)
    (a, w1t, w3t), tma = operands(h, [w1.data, w3.data], cfg)
    _SWIGLU[run["grid"]](
        a, w1t, w3t, scale_arg(w1), scale_arg(w3), out, m, f, c, h.stride(0), w1.data.stride(0),
        EVEN_K=c % cfg.block_k == 0, W_FP8=w_fp8(w1), FP32=x.dtype == torch.float32, TMA=tma,
        **run["meta"],
    )
    return out
