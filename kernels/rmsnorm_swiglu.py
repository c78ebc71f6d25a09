"""RMSNorm + gate and up projections + SiLU(gate) * up, for one decode token.

    h = x * rsqrt(mean(x^2) + eps) * g;  out = silu(h @ W1.T) * (h @ W3.T)

A program owns the same BLOCK_N rows of W1 and W3 and streams both in one loop, so x is read once per
tile and the (F,) gate and up vectors never leave registers; only their product is written.
Legend: C dim, F hidden. Llama-2-7B bf16: reads 2 x 90.2 MB (W1, W3: 11008 x 4096), writes 22 KB.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from llamafast.config import Weight

from ._common import cdiv, check_vector, check_weight, scale_arg
from .gemv import GemvConfig, dot_rows, gemv_config, launch_args
from .quantize_activation import gemv_input
from .tp_sync import consumer_args, release_slot

# (F, C, bytes per weight) -> launch. H100 (scripts/results/tune_7b*.txt): 64.8 us = 2785 GB/s at 7B in bf16,
# 35.9 us = 2516 GB/s in FP8 (E5M2).
CONFIGS: dict[tuple, GemvConfig] = {
    (11008, 4096, 2): GemvConfig(block_n=8, block_k=512, num_warps=4),
    (11008, 4096, 1): GemvConfig(block_n=2, block_k=512, num_warps=1),
    # Tensor-parallel shards (TP=2 at 7B, 13B and 70B), tuned on one H200 (scripts/results/tp/tune_tp2_*.json):
    (5504, 4096, 2): GemvConfig(block_n=4, block_k=256, num_warps=2),  # 27.5 us
    # 13B: timed alone, 2 rows and one warp a program won (41.1 us against 42.5), but in the step, under PDL,
    # that launch held the floor at 4.77 ms/token against 3.60 with this one (3.73 without PDL: one H200,
    # scripts/experiments/tp_floor_13b.txt).
    (6912, 5120, 2): GemvConfig(block_n=2, block_k=1024, num_warps=2),
    (14336, 8192, 2): GemvConfig(block_n=2, block_k=1024, num_warps=2),  # 118.3 us, 70B
    # The same shards adding the ranks' partials (symm, gemv.gemv_config's summed key): each program reads them
    # whole, so fewer, larger programs win. The whole TP=2 step on two H100s (scripts/profile_tp.py --sweep,
    # scripts/results/tp/h100x2_sweep/): 70B 24.718 ms/token against 26.007 with the entry above. 13B's is the
    # floor's runner-up in tp_floor_13b.txt (3.63 ms/token), 432 programs, not the sweep's 4 rows and 2 warps,
    # which ran the floor at 4.91 ms/token.
    (6912, 5120, 2, "summed"): GemvConfig(block_n=16, block_k=256, num_warps=4),
    (14336, 8192, 2, "summed"): GemvConfig(block_n=4, block_k=1024, num_warps=4),
}
# An H200's own launches, chosen by the whole step of 7B, of 70B in FP8 and of TP=2 shards (kernels.ON_GPU says how).
H200: dict[tuple, GemvConfig] = {
    (11008, 4096, 2): GemvConfig(block_n=2, block_k=1024, num_warps=2),
    (11008, 4096, 1): GemvConfig(block_n=2, block_k=512, num_warps=2, pdl=True),
    (28672, 8192, 1): GemvConfig(block_n=2, block_k=512, num_warps=2, pdl=True),  # 70B
    (6912, 5120, 2): GemvConfig(block_n=4, block_k=256, num_warps=2),  # 13B TP=2 shard
}
# An H100's own launches, chosen by the whole 7B step (kernels.ON_GPU says how).
H100: dict[tuple, GemvConfig] = {
    (11008, 4096, 2): GemvConfig(block_n=2, block_k=1024, num_warps=2),
    (11008, 4096, 1): GemvConfig(block_n=2, block_k=512, num_warps=2, pdl=True),
    (11008, 4096, "q8_0"): GemvConfig(block_n=2, block_k=2048, num_warps=8),
    (11008, 4096, "q4_0"): GemvConfig(block_n=8, block_k=1024, num_warps=8),
}


@triton.jit
def _rmsnorm_swiglu_kernel(
    x_ptr, g_ptr, w1_ptr, w3_ptr, s1_ptr, s3_ptr, out_ptr,  # x, g (C,); W1, W3 (F, C); E4M3 scales (F,); out (F,)
    F, C, stride_wn, eps,  # sizes; W1/W3 row stride
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, W_FP8: tl.constexpr,
    p_ptr=None, xo_ptr=None, f_ptr=None, PARTS: tl.constexpr = 0,  # tensor parallel: x + partials (tp_sync.py)
    PDL: tl.constexpr = False,  # launched with programmatic dependent launch (gemv.use_pdl)
    FLOAT_BLOCKS: tl.constexpr = False,  # gemv.GemvConfig.float_blocks
):
    swiglu_tile(tl.program_id(0), x_ptr, g_ptr, w1_ptr, w3_ptr, s1_ptr, s3_ptr, out_ptr, F, C, stride_wn, eps,
                BLOCK_N, BLOCK_K, EVEN_K, W_FP8, p_ptr, xo_ptr, PARTS, PDL, f_ptr, PARTS, FLOAT_BLOCKS=FLOAT_BLOCKS)
    if PARTS > 0:
        release_slot(f_ptr, tl.num_programs(0))


@triton.jit
def swiglu_tile(
    tile, x_ptr, g_ptr, w1_ptr, w3_ptr, s1_ptr, s3_ptr, out_ptr, F, C, stride_wn, eps,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, W_FP8: tl.constexpr,
    p_ptr=None, xo_ptr=None, PARTS: tl.constexpr = 0, PDL: tl.constexpr = False,
    wait_ptr=None, wait_target=0, watchdog_ptr=None, WAIT: tl.constexpr = False,  # decode_step.py
    PREFETCH: tl.constexpr = 0, FLOAT_BLOCKS: tl.constexpr = False, share=0, SHARES: tl.constexpr = 0,  # dot_rows'
):
    """Output rows (neurons) tile * BLOCK_N ... ."""
    rows = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = rows < F
    gate, up, ss = dot_rows(
        w1_ptr, w3_ptr, s1_ptr, s3_ptr, x_ptr, g_ptr, rows, mask, C, stride_wn, BLOCK_N, BLOCK_K, True, True, EVEN_K, W_FP8,
        p_ptr, xo_ptr, PARTS, PDL, wait_ptr, wait_target, watchdog_ptr, WAIT, PREFETCH, FLOAT_BLOCKS, share,
        SHARES,
    )
    rstd = tl.rsqrt(ss / C + eps)
    a, b = gate * rstd, up * rstd
    tl.store(out_ptr + rows, (a * tl.sigmoid(a) * b).to(out_ptr.dtype.element_ty), mask=mask)


def rmsnorm_swiglu(x, norm_w, w1: Weight, w3: Weight, eps, configs=None):
    """Same contract as llamafast.reference.rmsnorm_swiglu for one token: x (1, C) -> (1, F); x may be a
    tp_sync.SummedInput."""
    x, parts = consumer_args(x)
    f, c = w1.shape
    check_vector("x", x, c)
    check_vector("norm_w", norm_w, c)
    check_weight("w1", w1, c)
    check_weight("w3", w3, c)
    a, b = w1.data, w3.data
    assert a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype, "w1, w3: same shape, layout"
    assert w1.fmt == w3.fmt and (w1.scale is None) == (w3.scale is None), "w1 and w3: the same weight format"
    out = torch.empty((1, f), device=x.device, dtype=x.dtype)
    cfg = gemv_config(CONFIGS if configs is None else configs, w1, summed=bool(parts))
    _rmsnorm_swiglu_kernel[(cdiv(f, cfg.block_n),)](
        gemv_input(x, w1, cfg, norm_w), norm_w, a, b, scale_arg(w1), scale_arg(w3), out,
        f, c, a.stride(0), eps, **launch_args(cfg, w1, pdl=True), **parts
    )
    return out
