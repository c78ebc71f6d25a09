"""Shared pieces of the batch-1 decode kernels: the row-block GEMV loop and launch settings.

Every decode matmul has M = 1, so it is a GEMV: y[n] = sum_k W[n, k] * x[k] with W in nn.Linear layout
(N, K), contiguous along K. A program owns BLOCK_N rows and streams them in (BLOCK_N, BLOCK_K) tiles,
accumulating in fp32 registers; tl.dot would waste 15/16 of an MMA tile at M = 1 (KERNELS.md).
The activation x (8 KB at 7B) is re-read from L2 by every program, which is how RMSNorm is fused: its
statistic sum(x^2) is accumulated in the same loop and applied to the finished row sums.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

# True where kernels run on CPU tensors through Triton's interpreter (the tests without a GPU).
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
# Programmatic dependent launch between consecutive decode kernels (Hopper and newer). Off: on the H100,
# 7B bf16 decode ran at 199.1 tok/s with it and 202.7 without, twice each (scripts/results/pdl_ab.txt);
# with E5M2 weights 347.9 with it and 346.0 without (pdl_ab_fp8.txt): no gain worth a second code path.
ENABLE_PDL = False


# Host-side launch arithmetic in plain Python. In triton 3.6, triton.next_power_of_2 and triton.cdiv are
# constexpr functions whose host calls pass through a wrapper that unwraps every argument; a 7B prefill called
# them ~450 times per forward pass, 5 of the 33 ms cProfile counted for queueing one (prefill_host.txt in
# scripts/results).
def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def dot_dim(n: int) -> int:
    """A block side for tl.dot: the next power of two, at least 16 (tl.dot needs 16 along every side)."""
    return max(16, next_pow2(n))


@functools.lru_cache
def use_pdl(device: torch.device) -> bool:
    """PDL needs compute capability 9.0 (griddepcontrol); the interpreter has no inline PTX."""
    return ENABLE_PDL and not INTERPRET and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


@triton.jit
def pdl_prologue(USE_PDL: tl.constexpr):
    """With PDL the next kernel is launched while this one still runs: its programs get resident and wait
    here, at the top, for this kernel to finish, so the launch and ramp-up overlap this kernel's tail.
    Waiting before any load or store keeps every read-after-write and buffer reuse ordered."""
    if USE_PDL:
        gdc_launch_dependents()
        gdc_wait()


@triton.jit
def dot_rows(
    w_ptr, w2_ptr, s_ptr, s2_ptr, x_ptr, g_ptr,  # weights (N, K), w2 read only when PAIR; their E4M3 row scales
    rows, row_mask, K, stride_wn,  # (BLOCK_N,) row indices and mask; reduction length; weights' row stride
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    NORM: tl.constexpr, PAIR: tl.constexpr, EVEN_K: tl.constexpr,  # fuse RMSNorm; also W2[rows] @ x; K % BLOCK_K == 0
    W_FP8: tl.constexpr,  # 0: float weights; 1: E5M2 bit patterns in int8; 2: E4M3 in int8 with fp32 row scales
):
    """Returns (W[rows] @ (x * g), W2[rows] @ (x * g), sum(x^2)) in fp32; unused parts are 0."""
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)  # reduced once, after the loop
    acc2 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    ss = tl.zeros((BLOCK_K,), dtype=tl.float32)
    offs = rows[:, None].to(tl.int64) * stride_wn
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        x = _load_vector(x_ptr, k, K, EVEN_K)
        if NORM:
            ss += x * x
            x = x * _load_vector(g_ptr, k, K, EVEN_K)
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
    if W_FP8 == 1:
        w = w.to(tl.float8e5, bitcast=True)
    elif W_FP8 == 2:
        w = w.to(tl.float8e4nv, bitcast=True)
    return w.to(tl.float32)


@dataclass(frozen=True)
class GemvConfig:
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int = 1


def gemv_config(table: dict[tuple[int, int, int], GemvConfig], w: torch.Tensor) -> GemvConfig:
    """The tuned launch for a weight's (N, K, bytes per element), else a default that keeps every SM busy."""
    n, k = w.shape
    if (n, k, w.element_size()) in table:
        return table[(n, k, w.element_size())]
    if INTERPRET:  # numpy runs one program at a time: few large programs are fastest
        return GemvConfig(min(64, next_pow2(n)), min(256, next_pow2(k)), num_warps=4)
    # The shape of the 7B winners (scripts/results/tune_7b.txt): 1024-wide K tiles; 2 rows and one warp per
    # program when N is small, 8 rows and 4 warps when there are rows enough for many waves.
    block_k = min(1024, next_pow2(k))
    return GemvConfig(8, block_k, 4) if n >= 8192 else GemvConfig(2, block_k, 1)


def launch_args(cfg: GemvConfig, w: torch.Tensor, scale: torch.Tensor | None, block_n: int | None = None) -> dict:
    """The meta-parameters and launch options every GEMV kernel takes, for weight w (and its E4M3 scale)."""
    pdl = use_pdl(w.device)
    return {
        "BLOCK_N": block_n or cfg.block_n, "BLOCK_K": cfg.block_k, "EVEN_K": w.shape[1] % cfg.block_k == 0,
        "W_FP8": fp8_code(w, scale), "USE_PDL": pdl,
        "num_warps": cfg.num_warps, "num_stages": cfg.num_stages, "launch_pdl": pdl,
    }


def fp8_code(w: torch.Tensor, scale: torch.Tensor | None) -> int:
    """W_FP8 for a weight: 0 float, 1 E5M2 (int8 without scale), 2 E4M3 (int8 with per-row fp32 scales)."""
    if w.dtype != torch.int8:
        assert scale is None, "a float weight has no scale"
        return 0
    if scale is None:
        return 1
    assert scale.dtype == torch.float32 and scale.shape == (w.shape[0],), "E4M3 scales: (N,) fp32"
    return 2


def check_vector(name: str, t: torch.Tensor, n: int) -> None:
    assert t.is_contiguous() and t.numel() == n, f"{name}: expected {n} contiguous elements, got {tuple(t.shape)}"


def check_rows(name: str, t: torch.Tensor, k: int) -> None:
    """A matrix of rows of length k (weights (N, K), prompt activations (M, K)), each row contiguous."""
    assert t.dim() == 2 and t.shape[1] == k, f"{name}: expected (rows, {k}), got {tuple(t.shape)}"
    assert t.stride(1) == 1, f"{name}: rows must be contiguous along K"
