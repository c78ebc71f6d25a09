"""Shared pieces of the batch-1 decode kernels: the row-block GEMV loop and launch settings.

Every decode matmul has M = 1, so it is a GEMV: y[n] = sum_k W[n, k] * x[k] with W in nn.Linear layout
(N, K), contiguous along K. A program owns BLOCK_N rows and streams them in (BLOCK_N, BLOCK_K) tiles,
accumulating in fp32 registers; tl.dot would waste 15/16 of an MMA tile at M = 1 (its smallest M is 16).
The activation x (8 KB at 7B) is re-read from L2 by every program, which is how RMSNorm is fused: its
statistic sum(x^2) is accumulated in the same loop and applied to the finished row sums.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from llamafast.config import Weight, WeightFormat

from ._common import INTERPRET, next_pow2, pdl_capable, w_fp8
from .counters import wait_arrivals, wait_count
from .gemv_floats import dot_floats
from .gemv_int8 import dot_int8
from .gemv_tiles import activation, load_tile, pair_tiles, row_scaled


@triton.jit
def dot_rows(
    w_ptr, w2_ptr, s_ptr, s2_ptr, x_ptr, g_ptr,  # weights (N, K), w2 read only when PAIR; their E4M3 row scales
    rows, row_mask, K, stride_wn,  # (BLOCK_N,) row indices and mask; reduction length; weights' row stride
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    NORM: tl.constexpr, PAIR: tl.constexpr, EVEN_K: tl.constexpr,  # fuse RMSNorm; also W2[rows] @ x; K % BLOCK_K == 0
    W_FP8: tl.constexpr,  # 0: float weights; 1: E5M2 bit patterns in int8; 2: E4M3 in int8 with fp32 row scales;
    # 3-5: the block formats Q8_0, Q4_0, Q4_1, 6-8 Q4_K, Q5_K, Q6_K, on int8 activations: x quantize_activation.py's
    # int8 blocks, or x itself, which the GEMV rounds to them (gemv_int8.py; the persistent kernel's x is always x)
    p_ptr=None, xo_ptr=None, PARTS: tl.constexpr = 0,  # tensor parallel: x is x + PARTS fp32 partials (tp_sync.py)
    PDL: tl.constexpr = False,  # launched with programmatic dependent launch (use_pdl): see _first_tile
    wait_ptr=None, wait_target=0, watchdog_ptr=None,  # WAIT, PARTS: x is ready once *wait_ptr >= wait_target
    WAIT: tl.constexpr = False,  # with PREFETCH only: the persistent kernel's path
    PREFETCH: tl.constexpr = 0,  # 1: each weight tile loaded one step ahead (_prefetched); n > 1: _staged
    FLOAT_BLOCKS: tl.constexpr = False,  # Q8_0, Q4_0, Q4_1 against float x (gemv_floats.py: GemvConfig.float_blocks)
    share=0, SHARES: tl.constexpr = 0,  # PARTS in the persistent step: which elements of the sum this task stores
):
    """Returns (W[rows] @ (x * g), W2[rows] @ (x * g), sum(x^2)) in fp32; unused parts are 0. With PARTS, x is
    complete once the flag at wait_ptr counts wait_target arrivals: under PDL the first weight tile is read
    before that wait, otherwise the wait comes first."""
    tl.static_assert(PREFETCH > 0 or not WAIT, "WAIT is the persistent kernel's, which prefetches")
    tl.static_assert(PARTS == 0 or (PREFETCH == 0) == (SHARES == 0), "the persistent step's partials: SHARES")
    if PARTS > 0:
        if not PDL:
            wait_arrivals(wait_ptr, wait_target)
    if W_FP8 >= 3:  # the block formats: their own loops, so the float and FP8 loops below compile without them
        tl.static_assert(PARTS == 0, "block-format weights run on one GPU")
        if FLOAT_BLOCKS:
            tl.static_assert(W_FP8 <= 5 and PREFETCH == 0, "float activations: Q8_0, Q4_0, Q4_1, per-op GEMVs")
            out, out2, ss = dot_floats(w_ptr, w2_ptr, s_ptr, s2_ptr, x_ptr, g_ptr, rows, row_mask, K, stride_wn,
                                       BLOCK_N, BLOCK_K, NORM, PAIR, EVEN_K, W_FP8, PDL)
        else:
            out, out2, ss = dot_int8(w_ptr, w2_ptr, s_ptr, s2_ptr, x_ptr, g_ptr, rows, row_mask, K, stride_wn,
                                     BLOCK_N, BLOCK_K, NORM, PAIR, EVEN_K, W_FP8, PDL, wait_ptr, wait_target,
                                     watchdog_ptr, WAIT, PREFETCH)
        return out, out2, ss
    offs = rows[:, None].to(tl.int64) * stride_wn
    if PREFETCH > 1:
        return _staged(w_ptr + offs, w2_ptr + offs, s_ptr, s2_ptr, x_ptr, g_ptr, p_ptr, xo_ptr, rows, row_mask, K,
                       BLOCK_N, BLOCK_K, NORM, PAIR, EVEN_K, W_FP8, PARTS, wait_ptr, wait_target, watchdog_ptr,
                       WAIT, PREFETCH, share, SHARES)
    if PREFETCH == 1:
        return _prefetched(w_ptr + offs, w2_ptr + offs, s_ptr, s2_ptr, x_ptr, g_ptr, p_ptr, xo_ptr, rows, row_mask, K,
                           BLOCK_N, BLOCK_K, NORM, PAIR, EVEN_K, W_FP8, PARTS, wait_ptr, wait_target, watchdog_ptr,
                           WAIT, share, SHARES)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)  # reduced once, after the loop
    acc2 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    ss = tl.zeros((BLOCK_K,), dtype=tl.float32)
    start = 0
    if PDL:
        k = tl.arange(0, BLOCK_K)
        w, w2 = _first_tile(w_ptr + offs, w2_ptr + offs, k, K, row_mask, EVEN_K, W_FP8, PAIR)
        if PARTS > 0:
            wait_arrivals(wait_ptr, wait_target)
        x, ss = activation(x_ptr, g_ptr, p_ptr, xo_ptr, ss, k, K, NORM, EVEN_K, PARTS)
        acc += w * x[None, :]
        if PAIR:
            acc2 += w2 * x[None, :]
        start = BLOCK_K
    for k0 in range(start, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        x, ss = activation(x_ptr, g_ptr, p_ptr, xo_ptr, ss, k, K, NORM, EVEN_K, PARTS)
        acc += load_tile(w_ptr + offs, k, K, row_mask, EVEN_K, W_FP8).to(tl.float32) * x[None, :]
        if PAIR:
            acc2 += load_tile(w2_ptr + offs, k, K, row_mask, EVEN_K, W_FP8).to(tl.float32) * x[None, :]
    out, out2 = row_scaled(tl.sum(acc, axis=1), tl.sum(acc2, axis=1), s_ptr, s2_ptr, rows, row_mask, PAIR, W_FP8)
    return out, out2, tl.sum(ss, axis=0)


@triton.jit
def _prefetched(row_ptrs, row_ptrs2, s_ptr, s2_ptr, x_ptr, g_ptr, p_ptr, xo_ptr, rows, row_mask, K,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NORM: tl.constexpr, PAIR: tl.constexpr,
                EVEN_K: tl.constexpr, W_FP8: tl.constexpr, PARTS: tl.constexpr, wait_ptr, wait_target, watchdog_ptr,
                WAIT: tl.constexpr, share, SHARES: tl.constexpr):
    """dot_rows for a persistent kernel, which has few programs per SM to hide latency with: each tile's load is
    issued one step ahead of its multiply and kept as stored (bf16 or int8) until then, and each tile's products
    are summed to its rows at once, so a program holds (BLOCK_N,) sums instead of (BLOCK_N, BLOCK_K) fp32 tiles.
    The first tile is read before the wait for x (weights are never written while decoding); with PARTS, x is
    complete once the peers' flag at wait_ptr is up."""
    w, w2 = pair_tiles(row_ptrs, row_ptrs2, tl.arange(0, BLOCK_K), K, row_mask, EVEN_K, W_FP8, PAIR)
    if WAIT:
        wait_count(wait_ptr, wait_target, watchdog_ptr, PARTS > 0)
    out = tl.zeros((BLOCK_N,), dtype=tl.float32)
    out2 = tl.zeros((BLOCK_N,), dtype=tl.float32)
    ss = tl.zeros((BLOCK_K,), dtype=tl.float32)
    last = (K - 1) // BLOCK_K * BLOCK_K
    for k0 in range(0, last, BLOCK_K):
        k_next = k0 + BLOCK_K + tl.arange(0, BLOCK_K)
        w_next, w2_next = pair_tiles(row_ptrs, row_ptrs2, k_next, K, row_mask, EVEN_K, W_FP8, PAIR)
        x, ss = activation(x_ptr, g_ptr, p_ptr, xo_ptr, ss, k0 + tl.arange(0, BLOCK_K), K, NORM, EVEN_K, PARTS, share,
                           SHARES)
        out += tl.sum(w.to(tl.float32) * x[None, :], axis=1)
        if PAIR:
            out2 += tl.sum(w2.to(tl.float32) * x[None, :], axis=1)
        w, w2 = w_next, w2_next
    x, ss = activation(x_ptr, g_ptr, p_ptr, xo_ptr, ss, last + tl.arange(0, BLOCK_K), K, NORM, EVEN_K, PARTS, share,
                       SHARES)
    out += tl.sum(w.to(tl.float32) * x[None, :], axis=1)
    if PAIR:
        out2 += tl.sum(w2.to(tl.float32) * x[None, :], axis=1)
    out, out2 = row_scaled(out, out2, s_ptr, s2_ptr, rows, row_mask, PAIR, W_FP8)
    return out, out2, tl.sum(ss, axis=0)


@triton.jit
def _staged(row_ptrs, row_ptrs2, s_ptr, s2_ptr, x_ptr, g_ptr, p_ptr, xo_ptr, rows, row_mask, K,
            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NORM: tl.constexpr, PAIR: tl.constexpr,
            EVEN_K: tl.constexpr, W_FP8: tl.constexpr, PARTS: tl.constexpr, wait_ptr, wait_target, watchdog_ptr,
            WAIT: tl.constexpr, STAGES: tl.constexpr, share, SHARES: tl.constexpr):
    """dot_rows for a persistent kernel, its tiles after the first copied to shared memory STAGES - 1 ahead of
    their multiply (cp.async, Triton's software pipeline), so a program has more bytes in flight than registers
    hold; the first tile is read into registers before the wait for x, as in _prefetched."""
    k = tl.arange(0, BLOCK_K)
    w, w2 = pair_tiles(row_ptrs, row_ptrs2, k, K, row_mask, EVEN_K, W_FP8, PAIR)
    if WAIT:
        wait_count(wait_ptr, wait_target, watchdog_ptr, PARTS > 0)
    x, ss = activation(x_ptr, g_ptr, p_ptr, xo_ptr, tl.zeros((BLOCK_K,), dtype=tl.float32), k, K, NORM, EVEN_K, PARTS,
                       share, SHARES)
    out = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
    out2 = tl.sum(w2.to(tl.float32) * x[None, :], axis=1)
    for k0 in tl.range(BLOCK_K, K, BLOCK_K, num_stages=STAGES):
        k = k0 + tl.arange(0, BLOCK_K)
        x, ss = activation(x_ptr, g_ptr, p_ptr, xo_ptr, ss, k, K, NORM, EVEN_K, PARTS, share, SHARES)
        out += tl.sum(load_tile(row_ptrs, k, K, row_mask, EVEN_K, W_FP8).to(tl.float32) * x[None, :], axis=1)
        if PAIR:
            out2 += tl.sum(load_tile(row_ptrs2, k, K, row_mask, EVEN_K, W_FP8).to(tl.float32) * x[None, :], axis=1)
    out, out2 = row_scaled(out, out2, s_ptr, s2_ptr, rows, row_mask, PAIR, W_FP8)
    return out, out2, tl.sum(ss, axis=0)


@triton.jit
def _first_tile(row_ptrs, row_ptrs2, k, K, row_mask, EVEN_K: tl.constexpr, W_FP8: tl.constexpr,
                PAIR: tl.constexpr):
    """The first weight tile, read before waiting for x (weights are never written while decoding). Under
    programmatic dependent launch (PDL), the only caller, this kernel starts while the previous one still runs: it lets the next
    kernel start too, reads the tile, and only then waits for the previous kernel, before reading any activation
    or writing anything; the experiment that measured PDL slower (scripts/experiments/pdl_ab.txt: 199.1 against
    202.7 tok/s, bf16) waited first and loaded after."""
    gdc_launch_dependents()
    w = load_tile(row_ptrs, k, K, row_mask, EVEN_K, W_FP8).to(tl.float32)
    w2 = w
    if PAIR:
        w2 = load_tile(row_ptrs2, k, K, row_mask, EVEN_K, W_FP8).to(tl.float32)
    gdc_wait()
    return w, w2


@dataclass(frozen=True)
class GemvConfig:
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int = 1
    # Block weights only: the GEMV rounds its own input to int8 blocks, tile by tile in every program, instead of
    # reading them from a quantize pass launched before it (quantize_activation.gemv_input). It trades that launch
    # for ALU in every program; tuning chooses per shape (tuning/sweep.sweep).
    own_int8: bool = False
    # Launched under programmatic dependent launch even where use_pdl leaves the weights without it (FP8): set
    # where the whole step chose it with this launch (kernels.ON_GPU).
    pdl: bool = False
    # Q8_0, Q4_0 and Q4_1 weights only (gemv_floats.FORMATS): float activations times the weights dequantized in
    # registers, the reference's arithmetic (gemv_floats.py), instead of int8 ones. Tuning offers it where K is
    # small (tuning.sweep.FLOAT_BLOCKS_MAX_K).
    float_blocks: bool = False


def gemv_config(table: dict[tuple, GemvConfig], w: torch.Tensor | Weight, summed: bool = False) -> GemvConfig:
    """The tuned launch for a weight's (N, K, bytes per element; a block format's name), else a default that keeps
    every SM busy (its BLOCK_K, a power of two of at least K's 32, is a whole number of blocks). summed: the kernel
    also adds the tensor-parallel ranks' partials (tp_sync.SummedInput), whose own launch, where the table has one,
    is under the key + ("summed",)."""
    key = gemv_key(w)
    n, k = key[:2]
    if summed and (*key, "summed") in table:
        return table[(*key, "summed")]
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
    may be launched with it (the dense decode kernels, when use_pdl or cfg.pdl)."""
    args = {
        "BLOCK_N": block_n or cfg.block_n, "BLOCK_K": cfg.block_k, "EVEN_K": w.shape[1] % cfg.block_k == 0,
        "W_FP8": w_fp8(w), "num_warps": cfg.num_warps, "num_stages": cfg.num_stages,
    }
    if pdl:
        on = use_pdl(w) or (cfg.pdl and pdl_capable(w.data.device))
        args.update(PDL=on, launch_pdl=on)
    if w.fmt.is_block:  # the dense decode kernels, the only ones block weights reach
        args["FLOAT_BLOCKS"] = cfg.float_blocks
    return args


def use_pdl(w: Weight) -> bool:
    """Programmatic dependent launch between the decode GEMVs, their first weight tile read before the wait
    (_first_tile), for float weights and those that take int8 activations (gemv_int8.py, behind
    quantize_activation.py's kernel, launched the same way). Llama-2-7B, `bench --random-weights --fp8`, one
    process per run: bf16 202.3/202.5 -> 207.7/207.6 tok/s on the H100 (+2.6%), +2.8% on the H200; FP8 E5M2
    345.6/346.1 -> 344.0/343.8 (-0.6%) on the H100, -3.7% on the H200 (an FP8 tile is half the bytes read ahead of
    the wait), so FP8 goes without; int8 activations, one process alternating (scripts/experiments/pdl_ab_int8.txt):
    Q8_0 322.6 -> 346.0, Q4_0 470.2 -> 511.5, Q4_1 435.0 -> 458.6 on the H100. The K-quants' float loop, which
    had no first tile to read ahead, lost 2-4% under it (pdl_ab_kquants.txt); on int8 activations they read that
    tile ahead as the other block formats do, and take it. A launch may take it where this does not
    (GemvConfig.pdl): on an H200, 7B's FP8 GEMVs do, with launches the whole step chose under it (kernels.ON_GPU)."""
    return (w.fmt == WeightFormat.float or w.int8_activations) and pdl_capable(w.data.device)
