"""Shared pieces of the batch-1 decode kernels: the row-block GEMV loop and launch settings.

Every decode matmul has M = 1, so it is a GEMV: y[n] = sum_k W[n, k] * x[k] with W in nn.Linear layout
(N, K), contiguous along K. A program owns BLOCK_N rows and streams them in (BLOCK_N, BLOCK_K) tiles,
accumulating in fp32 registers; tl.dot would waste 15/16 of an MMA tile at M = 1 (its smallest M is 16).
The activation x (8 KB at 7B) is re-read from L2 by every program, which is how RMSNorm is fused: its
statistic sum(x^2) is accumulated in the same loop and applied to the finished row sums.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from llamafast.config import Weight, WeightFormat

from ._common import INTERPRET, decode_weights, next_pow2, w_fp8


@triton.jit
def dot_rows(
    w_ptr, w2_ptr, s_ptr, s2_ptr, x_ptr, g_ptr,  # weights (N, K), w2 read only when PAIR; their E4M3 row scales
    rows, row_mask, K, stride_wn,  # (BLOCK_N,) row indices and mask; reduction length; weights' row stride
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    NORM: tl.constexpr, PAIR: tl.constexpr, EVEN_K: tl.constexpr,  # fuse RMSNorm; also W2[rows] @ x; K % BLOCK_K == 0
    W_FP8: tl.constexpr,  # 0: float weights; 1: E5M2 bit patterns in int8; 2: E4M3 in int8 with fp32 row scales
    p_ptr=None, xo_ptr=None, PARTS: tl.constexpr = 0,  # tensor parallel: x is x + PARTS fp32 partials (tp_sync.py)
    PDL: tl.constexpr = False,  # launched with programmatic dependent launch (use_pdl): see _pdl_first_tile
):
    """Returns (W[rows] @ (x * g), W2[rows] @ (x * g), sum(x^2)) in fp32; unused parts are 0."""
    if W_FP8 >= 3:  # the block formats: their own loop, so the float and FP8 loop below is compiled as it was
        return _dot_blocks(w_ptr, w2_ptr, s_ptr, s2_ptr, x_ptr, g_ptr, p_ptr, xo_ptr, rows, row_mask, K, stride_wn,
                           BLOCK_N, BLOCK_K, NORM, PAIR, EVEN_K, W_FP8, PARTS)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)  # reduced once, after the loop
    acc2 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    ss = tl.zeros((BLOCK_K,), dtype=tl.float32)
    offs = rows[:, None].to(tl.int64) * stride_wn
    start = 0
    if PDL:
        k = tl.arange(0, BLOCK_K)
        w, w2 = _pdl_first_tile(w_ptr + offs, w2_ptr + offs, k, K, row_mask, EVEN_K, W_FP8, PAIR)
        x, ss = _activation(x_ptr, g_ptr, p_ptr, xo_ptr, ss, k, K, NORM, EVEN_K, PARTS)
        acc += w * x[None, :]
        if PAIR:
            acc2 += w2 * x[None, :]
        start = BLOCK_K
    for k0 in range(start, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        x, ss = _activation(x_ptr, g_ptr, p_ptr, xo_ptr, ss, k, K, NORM, EVEN_K, PARTS)
        acc += _load_tile(w_ptr + offs, k, K, row_mask, EVEN_K, W_FP8) * x[None, :]
        if PAIR:
            acc2 += _load_tile(w2_ptr + offs, k, K, row_mask, EVEN_K, W_FP8) * x[None, :]
    out, out2 = tl.sum(acc, axis=1), tl.sum(acc2, axis=1)
    if W_FP8 == 2:  # the scale is per row, so it is applied once to the finished sums
        out = out * tl.load(s_ptr + rows, mask=row_mask, other=0.0)
        if PAIR:
            out2 = out2 * tl.load(s2_ptr + rows, mask=row_mask, other=0.0)
    return out, out2, tl.sum(ss, axis=0)


@triton.jit
def _dot_blocks(w_ptr, w2_ptr, s_ptr, s2_ptr, x_ptr, g_ptr, p_ptr, xo_ptr, rows, row_mask, K, stride_wn,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NORM: tl.constexpr, PAIR: tl.constexpr,
                EVEN_K: tl.constexpr, FMT: tl.constexpr, PARTS: tl.constexpr):
    """dot_rows for blocks of 32 weights with fp16 scales (BLOCK_K a multiple of 32), each block's products summed
    and then scaled once. Q8_0 reads (BLOCK_N, BLOCK_K) int8 tiles; a Q4 tile is (BLOCK_N, BLOCK_K / 2) bytes as
    stored: byte j of block b holds weights b*32 + j (low nibble) and b*32 + 16 + j (high), so x is loaded at
    those two index sets instead of the weights being reordered."""
    NB: tl.constexpr = BLOCK_K // 32
    offs = rows[:, None].to(tl.int64) * stride_wn
    acc, acc2 = tl.zeros((BLOCK_N, NB), dtype=tl.float32), tl.zeros((BLOCK_N, NB), dtype=tl.float32)
    soffs = rows[:, None].to(tl.int64) * (K // 32 * (2 if FMT == 5 else 1))  # Q4_1: (scale, min) pairs
    kb = tl.arange(0, NB)
    if FMT == 3:
        ss = tl.zeros((BLOCK_K,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            x, ss = _activation(x_ptr, g_ptr, p_ptr, xo_ptr, ss, k, K, NORM, EVEN_K, PARTS)
            acc += _q8_blocks(w_ptr + offs, s_ptr + soffs, k, k0 // 32 + kb, x, K, row_mask, EVEN_K, BLOCK_N, NB)
            if PAIR:
                acc2 += _q8_blocks(w2_ptr + offs, s2_ptr + soffs, k, k0 // 32 + kb, x, K, row_mask, EVEN_K, BLOCK_N, NB)
    else:
        ss = tl.zeros((BLOCK_K // 2,), dtype=tl.float32)
        c = tl.arange(0, BLOCK_K // 2)  # byte within the tile
        low = (c // 16) * 32 + c % 16  # the weight its low nibble holds
        for k0 in range(0, K, BLOCK_K):
            xl, ss = _activation(x_ptr, g_ptr, p_ptr, xo_ptr, ss, k0 + low, K, NORM, EVEN_K, PARTS)
            xh, ss = _activation(x_ptr, g_ptr, p_ptr, xo_ptr, ss, k0 + low + 16, K, NORM, EVEN_K, PARTS)
            xsum = tl.sum(tl.reshape(xl + xh, (NB, 16)), axis=1)  # each block's activations, for its offset
            b, bk = k0 // 2 + c, k0 // 32 + kb
            acc += _q4_blocks(w_ptr + offs, s_ptr + soffs, b, bk, xl, xh, xsum, K, row_mask, EVEN_K, FMT, BLOCK_N, NB)
            if PAIR:
                acc2 += _q4_blocks(w2_ptr + offs, s2_ptr + soffs, b, bk, xl, xh, xsum, K, row_mask, EVEN_K, FMT,
                                   BLOCK_N, NB)
    return tl.sum(acc, axis=1), tl.sum(acc2, axis=1), tl.sum(ss, axis=0)


@triton.jit
def _block_scales(scale_rows, kb, K, row_mask, EVEN_K: tl.constexpr, PAIRED: tl.constexpr, SECOND: tl.constexpr):
    """(BLOCK_N, NB) fp32: the tile's blocks' scales (PAIRED: Q4_1's (scale, min) pairs, SECOND: the min)."""
    mask = row_mask[:, None] if EVEN_K else row_mask[:, None] & (kb < K // 32)[None, :]
    return tl.load(scale_rows + (2 * kb + SECOND if PAIRED else kb)[None, :], mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _q8_blocks(row_ptrs, scale_rows, k, kb, x, K, row_mask, EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr,
               NB: tl.constexpr):
    """A Q8_0 tile times x: each block's sum of int8 * x, times its scale, (BLOCK_N, NB)."""
    mask = row_mask[:, None] if EVEN_K else row_mask[:, None] & (k < K)[None, :]
    w = tl.load(row_ptrs + k[None, :], mask=mask, other=0, eviction_policy="evict_first")
    part = tl.sum(tl.reshape(w.to(tl.float32) * x[None, :], (BLOCK_N, NB, 32)), axis=2)
    return part * _block_scales(scale_rows, kb, K, row_mask, EVEN_K, False, 0)


@triton.jit
def _q4_blocks(row_ptrs, scale_rows, b, kb, xl, xh, xsum, K, row_mask, EVEN_K: tl.constexpr, FMT: tl.constexpr,
               BLOCK_N: tl.constexpr, NB: tl.constexpr):
    """A Q4 tile times x, (BLOCK_N, NB): per block d * (sum q*x - 8 sum x) (Q4_0) or d * sum q*x + m * sum x (Q4_1)."""
    mask = row_mask[:, None] if EVEN_K else row_mask[:, None] & (b < K // 2)[None, :]
    q = tl.load(row_ptrs + b[None, :], mask=mask, other=0, eviction_policy="evict_first")
    lo, hi = (q & 0x0F).to(tl.float32), (q >> 4).to(tl.float32)
    part = tl.sum(tl.reshape(lo * xl[None, :] + hi * xh[None, :], (BLOCK_N, NB, 16)), axis=2)
    d = _block_scales(scale_rows, kb, K, row_mask, EVEN_K, FMT == 5, 0)
    if FMT == 4:
        return d * (part - 8.0 * xsum[None, :])
    return d * part + _block_scales(scale_rows, kb, K, row_mask, EVEN_K, True, 1) * xsum[None, :]


@triton.jit
def _activation(x_ptr, g_ptr, p_ptr, xo_ptr, ss, k, K, NORM: tl.constexpr, EVEN_K: tl.constexpr, PARTS: tl.constexpr):
    """The K-slice k of the input (plus the ranks' partials), RMSNorm-weighted when NORM; ss gains its squares."""
    x = _load_vector(x_ptr, k, K, EVEN_K)
    if PARTS > 0:
        x = _add_parts(x, p_ptr, xo_ptr, k, K, EVEN_K, PARTS)
    if NORM:
        ss += x * x
        x = x * _load_vector(g_ptr, k, K, EVEN_K)
    return x, ss


@triton.jit
def _pdl_first_tile(row_ptrs, row_ptrs2, k, K, row_mask, EVEN_K: tl.constexpr, W_FP8: tl.constexpr,
                    PAIR: tl.constexpr):
    """Under programmatic dependent launch this kernel starts while the previous one still runs. It lets the next
    kernel start too, reads its first weight tile (weights are never written while decoding), and only then waits
    for the previous kernel, before reading any activation or writing anything. The experiment that measured PDL
    slower (scripts/experiments/pdl_ab.txt: 199.1 against 202.7 tok/s, bf16) waited first and loaded after."""
    gdc_launch_dependents()
    w = _load_tile(row_ptrs, k, K, row_mask, EVEN_K, W_FP8)
    w2 = w
    if PAIR:
        w2 = _load_tile(row_ptrs2, k, K, row_mask, EVEN_K, W_FP8)
    gdc_wait()
    return w, w2


@triton.jit
def _add_parts(x, p_ptr, xo_ptr, k, K, EVEN_K: tl.constexpr, PARTS: tl.constexpr):
    """x + the ranks' partial sums (PARTS rows of K fp32, added in rank order, so every rank gets the same bits),
    rounded to the residual stream's dtype as the one-GPU linear_residual rounds it; program 0 stores it."""
    for r in tl.static_range(PARTS):
        x += _load_vector(p_ptr + r * K, k, K, EVEN_K)
    x = x.to(xo_ptr.dtype.element_ty)
    tl.store(xo_ptr + k, x, mask=(k < K) & (tl.program_id(0) == 0))
    return x.to(tl.float32)


@triton.jit
def _load_vector(ptr, k, K, EVEN_K: tl.constexpr):
    """A K-slice of a small vector that every program reads: keep it in cache."""
    if EVEN_K:
        return tl.load(ptr + k, eviction_policy="evict_last").to(tl.float32)
    return tl.load(ptr + k, mask=k < K, other=0.0, eviction_policy="evict_last").to(tl.float32)


@triton.jit
def _load_tile(row_ptrs, k, K, row_mask, EVEN_K: tl.constexpr, W_FP8: tl.constexpr):
    """A (BLOCK_N, BLOCK_K) weight tile in fp32, read once: stream it past the cache. FP8 weights arrive as
    int8 and are bitcast and upcast in registers."""
    if EVEN_K:  # no mask along K, so the loads stay 16 bytes wide
        w = tl.load(row_ptrs + k[None, :], mask=row_mask[:, None], other=0, eviction_policy="evict_first")
    else:
        mask = row_mask[:, None] & (k < K)[None, :]
        w = tl.load(row_ptrs + k[None, :], mask=mask, other=0, eviction_policy="evict_first")
    return decode_weights(w, W_FP8).to(tl.float32)


@dataclass(frozen=True)
class GemvConfig:
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int = 1


def gemv_config(table: dict[tuple[int, int, int], GemvConfig], w: torch.Tensor | Weight) -> GemvConfig:
    """The tuned launch for a weight's (N, K, bytes per element; a block format's name), else a default that keeps
    every SM busy (its BLOCK_K, a power of two of at least K's 32, is a whole number of blocks)."""
    key = gemv_key(w)
    n, k = key[:2]
    if key in table:
        return table[key]
    if INTERPRET:  # numpy runs one program at a time: few large programs are fastest
        return GemvConfig(min(64, next_pow2(n)), min(256, next_pow2(k)), num_warps=4)
    # The shape of the 7B winners (scripts/results/tune_7b.txt): 1024-wide K tiles; 2 rows and one warp per
    # program when N is small, 8 rows and 4 warps when there are rows enough for many waves.
    block_k = min(1024, next_pow2(k))
    return GemvConfig(8, block_k, 4) if n >= 8192 else GemvConfig(2, block_k, 1)


def gemv_key(w: torch.Tensor | Weight) -> tuple:
    """A launch table's key: (N, K, bytes per element) of float and FP8 weights, (N, K, format) of block ones."""
    if isinstance(w, Weight):
        if w.fmt.is_block:
            return (*w.shape, w.fmt.value)
        w = w.data
    return (*w.shape, w.element_size())


def launch_args(cfg: GemvConfig, w: Weight, block_n: int | None = None, pdl: bool = False) -> dict:
    """The meta-parameters and launch options every GEMV kernel takes, for weight w; pdl: the kernel takes PDL and
    may be launched with it (the dense decode kernels, when use_pdl)."""
    args = {
        "BLOCK_N": block_n or cfg.block_n, "BLOCK_K": cfg.block_k, "EVEN_K": w.shape[1] % cfg.block_k == 0,
        "W_FP8": w_fp8(w), "num_warps": cfg.num_warps, "num_stages": cfg.num_stages,
    }
    if pdl:
        on = use_pdl(w.data.device, w.fmt)
        args.update(PDL=on, launch_pdl=on)
    return args


def use_pdl(device: torch.device, fmt: WeightFormat) -> bool:
    """Programmatic dependent launch between the dense decode GEMVs, their first weight tile read before the wait
    (_pdl_first_tile), for float weights only. Llama-2-7B, `bench --random-weights --fp8`, one process per run: bf16
    202.3/202.5 -> 207.7/207.6 tok/s on the H100 (+2.6%), +2.8% on the H200; FP8 E5M2 345.6/346.1 -> 344.0/343.8
    (-0.6%) on the H100, -3.7% on the H200 (an FP8 tile is half the bytes read ahead of the wait); one process
    alternating both: scripts/experiments/pdl_ab.py."""
    return fmt == WeightFormat.float and _pdl_capable(device)


@functools.lru_cache
def _pdl_capable(device: torch.device) -> bool:
    """PDL needs compute capability 9.0 (griddepcontrol) and a real GPU."""
    return not INTERPRET and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9
