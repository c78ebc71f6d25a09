"""RMSNorm + QKV projection + RoPE + KV-cache write, for one decode token.

    qkv = (x * rsqrt(mean(x^2) + eps) * g) @ Wqkv.T;  q, k = rope(q), rope(k) at pos;  cache[pos] = k, v

RMSNorm is a per-row scale, so it commutes with the matmul: each program accumulates (x * g) against its
rows of Wqkv and sum(x^2) in the same loop, then scales the row sums by rsqrt (the kernl write-up).
RoPE rotates Meta's interleaved (even, odd) row pairs, which lie in the same program because BLOCK_N is
even; the angles come from the model's fp32 cos/sin tables at row pos (read from a device tensor, so the
launch replays unchanged in a CUDA graph). Rows past H*D are k then v, stored straight into the cache.
Legend: C dim, H heads, KVH kv heads, D head_dim, Smax cache length. Llama-2-7B bf16: reads 100.7 MB of
Wqkv (12288 x 4096), writes q (8 KB) and one position of k and v (8 KB each).
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from llamafast.config import Weight

from ._common import cdiv, check_vector, check_weight, scale_arg, w_fp8
from .gemv import GemvConfig, dot_rows, gemv_config, launch_args
from .gemv_floats import FORMATS as FLOAT_FORMATS
from .quantize_activation import gemv_input
from .tp_sync import consumer_args, release_slot

# (N, C, bytes per weight) -> launch. H100 (scripts/results/tune_7b*.txt): 36.7 us = 2741 GB/s at 7B in bf16,
# 21.5 us = 2342 GB/s in FP8 (E5M2).
CONFIGS: dict[tuple, GemvConfig] = {
    (12288, 4096, 2): GemvConfig(block_n=8, block_k=1024, num_warps=4),
    (12288, 4096, 1): GemvConfig(block_n=16, block_k=256, num_warps=4),
    # Tensor-parallel shards (TP=2 at 7B, 13B and 70B), tuned on one H200 (scripts/results/tp/tune_tp2_*.json):
    (6144, 4096, 2): GemvConfig(block_n=8, block_k=512, num_warps=2),  # 15.3 us
    (7680, 5120, 2): GemvConfig(block_n=8, block_k=512, num_warps=2),  # 22.2 us
    (5120, 8192, 2): GemvConfig(block_n=8, block_k=512, num_warps=4),  # 23.1 us, 70B
    # The same shard adding the ranks' partials (symm, gemv.gemv_config's summed key): each program reads them
    # whole, so fewer, larger programs win. The whole TP=2 step on two H100s (scripts/profile_tp.py --sweep,
    # scripts/results/tp/h100x2_sweep/sweep_7b.txt): 2.997 ms/token against 3.187 with the entry above.
    (6144, 4096, 2, "summed"): GemvConfig(block_n=16, block_k=512, num_warps=4),
}
# An H200's own launches, chosen by the whole step of 7B, of 70B in FP8 and of TP=2 shards (kernels.ON_GPU says how).
H200: dict[tuple, GemvConfig] = {
    (12288, 4096, 2): GemvConfig(block_n=8, block_k=256, num_warps=2),
    (12288, 4096, 1): GemvConfig(block_n=32, block_k=256, num_warps=8, pdl=True),
    (10240, 8192, 1): GemvConfig(block_n=8, block_k=1024, num_warps=4, pdl=True),  # 70B: gemv_config's default
    (6144, 4096, 2): GemvConfig(block_n=8, block_k=512, num_warps=4),  # 7B TP=2 shard
}
# An H100's own launches, chosen by the whole 7B step (kernels.ON_GPU says how).
H100: dict[tuple, GemvConfig] = {
    (12288, 4096, 2): GemvConfig(block_n=32, block_k=256, num_warps=8),
    (12288, 4096, 1): GemvConfig(block_n=4, block_k=512, num_warps=1, pdl=True),
    (12288, 4096, "q8_0"): GemvConfig(block_n=32, block_k=512, num_warps=8, own_int8=True),
}


@triton.jit
def _rmsnorm_qkv_rope_kernel(
    x_ptr, g_ptr, w_ptr, s_ptr, cos_ptr, sin_ptr, pos_ptr,  # x, g (C,); Wqkv (N, C), its E4M3 scales (N,); tables (Smax, D/2); pos ()
    q_ptr, k_cache_ptr, v_cache_ptr,  # q out (H*D,); caches (KVH, Smax, D)
    N, C, QD, KVD, stride_wn, stride_ch, stride_cs, eps,  # N = QD + 2*KVD rows; cache strides (head, seq)
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, W_FP8: tl.constexpr,
    p_ptr=None, xo_ptr=None, f_ptr=None, PARTS: tl.constexpr = 0,  # tensor parallel: x + partials (tp_sync.py)
    PDL: tl.constexpr = False,  # launched with programmatic dependent launch (gemv.use_pdl)
    t_ptr=None, ts_ptr=None, split=0, stride_tn=0, T_FMT: tl.constexpr = -1,  # rows from split on: tail weight
    FLOAT_BLOCKS: tl.constexpr = False,  # gemv.GemvConfig.float_blocks
):
    qkv_rope_tile(
        tl.program_id(0), x_ptr, g_ptr, w_ptr, s_ptr, cos_ptr, sin_ptr, pos_ptr, q_ptr, k_cache_ptr, v_cache_ptr,
        N, C, QD, KVD, stride_wn, stride_ch, stride_cs, eps, HEAD_DIM, BLOCK_N, BLOCK_K, EVEN_K, W_FP8,
        p_ptr, xo_ptr, PARTS, PDL, f_ptr, PARTS, t_ptr=t_ptr, ts_ptr=ts_ptr, split=split, stride_tn=stride_tn,
        T_FMT=T_FMT, FLOAT_BLOCKS=FLOAT_BLOCKS,
    )
    if PARTS > 0:
        release_slot(f_ptr, tl.num_programs(0))


@triton.jit
def qkv_rope_tile(
    tile, x_ptr, g_ptr, w_ptr, s_ptr, cos_ptr, sin_ptr, pos_ptr, q_ptr, k_cache_ptr, v_cache_ptr,
    N, C, QD, KVD, stride_wn, stride_ch, stride_cs, eps,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, W_FP8: tl.constexpr,
    p_ptr=None, xo_ptr=None, PARTS: tl.constexpr = 0, PDL: tl.constexpr = False,
    wait_ptr=None, wait_target=0, watchdog_ptr=None, WAIT: tl.constexpr = False,  # decode_step.py
    PREFETCH: tl.constexpr = 0,
    t_ptr=None, ts_ptr=None, split=0, stride_tn=0, T_FMT: tl.constexpr = -1,  # the tail's rows
    FLOAT_BLOCKS: tl.constexpr = False, share=0, SHARES: tl.constexpr = 0,  # dot_rows'
):
    """Rows tile * BLOCK_N ... of the kernel's output: q rows, or k and v rows stored into the caches. With T_FMT
    >= 0, rows from split on (a multiple of BLOCK_N) are the tail weight's, in block format T_FMT: each program
    takes one branch."""
    rows = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = rows < N
    if T_FMT >= 0:  # block formats only: no PDL or partials
        if tile * BLOCK_N >= split:
            acc, _, ss = dot_rows(t_ptr, t_ptr, ts_ptr, ts_ptr, x_ptr, g_ptr, rows - split, mask, C, stride_tn,
                                  BLOCK_N, BLOCK_K, True, False, EVEN_K, T_FMT, wait_ptr=wait_ptr,
                                  wait_target=wait_target, watchdog_ptr=watchdog_ptr, WAIT=WAIT, PREFETCH=PREFETCH,
                                  FLOAT_BLOCKS=FLOAT_BLOCKS)
        else:
            acc, _, ss = dot_rows(w_ptr, w_ptr, s_ptr, s_ptr, x_ptr, g_ptr, rows, mask, C, stride_wn, BLOCK_N,
                                  BLOCK_K, True, False, EVEN_K, W_FP8, wait_ptr=wait_ptr, wait_target=wait_target,
                                  watchdog_ptr=watchdog_ptr, WAIT=WAIT, PREFETCH=PREFETCH, FLOAT_BLOCKS=FLOAT_BLOCKS)
    else:
        acc, _, ss = dot_rows(
            w_ptr, w_ptr, s_ptr, s_ptr, x_ptr, g_ptr, rows, mask, C, stride_wn, BLOCK_N, BLOCK_K, True, False, EVEN_K,
            W_FP8, p_ptr, xo_ptr, PARTS, PDL, wait_ptr, wait_target, watchdog_ptr, WAIT, PREFETCH, FLOAT_BLOCKS,
            share, SHARES,
        )
    acc = acc * tl.rsqrt(ss / C + eps)
    # RoPE on (even, odd) row pairs of q and k; v rows pass through.
    pos = tl.load(pos_ptr)
    pair = (tile * BLOCK_N + 2 * tl.arange(0, BLOCK_N // 2)) % HEAD_DIM // 2
    cos = tl.load(cos_ptr + pos * (HEAD_DIM // 2) + pair)
    sin = tl.load(sin_ptr + pos * (HEAD_DIM // 2) + pair)
    a, b = tl.split(tl.reshape(acc, (BLOCK_N // 2, 2)))
    rotated = tl.reshape(tl.join(a * cos - b * sin, a * sin + b * cos), (BLOCK_N,))
    out = tl.where(rows < QD + KVD, rotated, acc)
    # Store: q rows to q, k and v rows into the caches at pos.
    tl.store(q_ptr + rows, out.to(q_ptr.dtype.element_ty), mask=rows < QD)
    kv_row = tl.where(rows < QD + KVD, rows - QD, rows - QD - KVD)
    offs = (kv_row // HEAD_DIM) * stride_ch + pos * stride_cs + kv_row % HEAD_DIM
    is_k = (rows >= QD) & (rows < QD + KVD)
    tl.store(k_cache_ptr + offs, out.to(k_cache_ptr.dtype.element_ty), mask=is_k)
    tl.store(v_cache_ptr + offs, out.to(v_cache_ptr.dtype.element_ty), mask=(rows >= QD + KVD) & mask)


def rmsnorm_qkv_rope(x, norm_w, wqkv: Weight, cos, sin, pos, k_cache, v_cache, eps, configs=None):
    """Same contract as llamafast.reference.rmsnorm_qkv_rope, for one token: x (1, C) -> q (1, H, D); x may be a
    tp_sync.SummedInput."""
    x, parts = consumer_args(x)
    n, c = wqkv.shape
    kvh, smax, d = k_cache.shape
    qd = n - 2 * kvh * d
    check_vector("x", x, c)
    check_vector("norm_w", norm_w, c)
    check_weight("wqkv", wqkv, c)
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(2) == 1, "k and v caches: same layout, D contiguous"
    assert cos.shape == (smax, d // 2) and cos.is_contiguous() and sin.is_contiguous(), "cos/sin: (Smax, D/2)"
    q = torch.empty((1, qd // d, d), device=x.device, dtype=x.dtype)
    cfg = gemv_config(CONFIGS if configs is None else configs, wqkv, summed=bool(parts))
    head, tail = wqkv.head, wqkv.tail
    if cfg.float_blocks and tail is not None and tail.fmt not in FLOAT_FORMATS:
        # A tail with no float loop: every row of the launch rounds x to int8 itself, one arithmetic for the weight
        cfg = dataclasses.replace(cfg, float_blocks=False, own_int8=True)
    block_n = qkv_rows(cfg.block_n, wqkv)
    _rmsnorm_qkv_rope_kernel[(cdiv(n, block_n),)](
        gemv_input(x, wqkv, cfg, norm_w), norm_w, head.data, scale_arg(head), cos, sin, pos, q, k_cache, v_cache,
        n, c, qd, kvh * d, head.data.stride(0), k_cache.stride(0), k_cache.stride(1), eps,
        HEAD_DIM=d, **launch_args(cfg, head, block_n, pdl=tail is None), **parts, **_tail_args(head, tail),
    )
    return q


def qkv_rows(block_n: int, wqkv: Weight) -> int:
    """Rows per program (tile) at most block_n: even, so both rows of a RoPE pair are in one program, and where
    wqkv has a tail, dividing its head's rows, so that a program's rows are all the head's or all the tail's."""
    block_n = max(2, block_n)
    while wqkv.tail is not None and wqkv.head.shape[0] % block_n:
        block_n //= 2
    return block_n


def _tail_args(head: Weight, tail: Weight | None) -> dict:
    """The kernel's tail arguments: the rows past the head's, in their own block format."""
    if tail is None:
        return {}
    check_weight("wqkv's tail", tail, head.shape[1])
    assert tail.fmt.is_block and head.shape[0] % 2 == 0, "a tail is block-format rows after an even head"
    return {"t_ptr": tail.data, "ts_ptr": scale_arg(tail), "split": head.shape[0], "stride_tn": tail.data.stride(0),
            "T_FMT": w_fp8(tail)}
