"""Shared pieces of the prefill kernels: the tiled tl.dot loop, the program order and the launch table.

A prompt of M tokens turns every projection into a real matmul, (M, K) @ W.T with W (N, K) in nn.Linear
layout, so these kernels use tensor cores (tl.dot) on (BLOCK_M, BLOCK_N) output tiles, where the decode
kernels (gemv.py) reduce with FMAs. Unlike decode, RMSNorm is a row pre-pass here (rmsnorm_rows.py says why);
RoPE, SiLU * up, residual adds and the cache writes are fused into the epilogues.
FP8 weights (int8 bit patterns) are bitcast and converted to the activation dtype in the tile load.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from llamafast.config import Weight

from .._common import INTERPRET, cdiv, decode_weights, dot_dim, scale_arg, w_fp8
from .launcher import Launcher


@triton.jit
def tile_offsets(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(first row, first column) of this program's output tile. Programs walk GROUP_M row tiles for each column
    tile, so a weight tile is read from DRAM once and served from L2 to the others (the Triton matmul tutorial)."""
    pid = tl.program_id(0)
    n_m, n_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * n_n
    first_m = (pid // per_group) * GROUP_M
    group_m = tl.minimum(n_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_m
    pid_n = (pid % per_group) // group_m
    return pid_m * BLOCK_M, pid_n * BLOCK_N


@triton.jit
def dot_tiles(
    a_ptr, stride_am, w_ptr, w2_ptr, stride_wn,  # activations (M, K); weights (N, K), w2 read only when PAIR
    off_m, off_n, M, N, K,  # the tile's first row and column
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PAIR: tl.constexpr, EVEN_K: tl.constexpr, W_FP8: tl.constexpr, FP32: tl.constexpr, TMA: tl.constexpr,
):
    """Returns (A[rows] @ W[cols].T, A[rows] @ W2[cols].T) in fp32; the second only when PAIR (else zeros).
    TMA 0: pointer loads. TMA 1: a_ptr, w_ptr and w2_ptr are host tensor descriptors (operands() made them);
    TMA 2: pointers, and the program builds the descriptors. With either the copy engine loads the tiles,
    zero-filling past the edges."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if TMA == 2:  # descriptors built by each program (in global scratch from triton's allocator)
        a_desc = tl.make_tensor_descriptor(a_ptr, [M, K], [stride_am, 1], [BLOCK_M, BLOCK_K])
        w_desc = tl.make_tensor_descriptor(w_ptr, [N, K], [stride_wn, 1], [BLOCK_N, BLOCK_K])
        if PAIR:
            w2_desc = tl.make_tensor_descriptor(w2_ptr, [N, K], [stride_wn, 1], [BLOCK_N, BLOCK_K])
        else:
            w2_desc = w_desc
        acc, acc2 = _tma_loop(a_desc, w_desc, w2_desc, off_m, off_n, K, acc, acc2, BLOCK_K, PAIR)
    elif TMA == 1:
        acc, acc2 = _tma_loop(a_ptr, w_ptr, w2_ptr, off_m, off_n, K, acc, acc2, BLOCK_K, PAIR)
    else:  # pointer loads (a constexpr branch: neither path is compiled into the other)
        rows, cols = off_m + tl.arange(0, BLOCK_M), off_n + tl.arange(0, BLOCK_N)
        k = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + rows[:, None].to(tl.int64) * stride_am + k[None, :]
        w_offs = cols[:, None].to(tl.int64) * stride_wn + k[None, :]
        row_mask, col_mask = (rows < M)[:, None], (cols < N)[:, None]
        for k0 in range(0, K, BLOCK_K):
            if EVEN_K:
                a = tl.load(a_ptrs + k0, mask=row_mask, other=0.0)
            else:
                a = tl.load(a_ptrs + k0, mask=row_mask & (k0 + k < K)[None, :], other=0.0)
            dtype = a_ptr.dtype.element_ty
            acc = _dot(a, _weight_tile(w_ptr + w_offs + k0, k0 + k, K, col_mask, EVEN_K, W_FP8, dtype), acc, FP32)
            if PAIR:
                w2 = _weight_tile(w2_ptr + w_offs + k0, k0 + k, K, col_mask, EVEN_K, W_FP8, dtype)
                acc2 = _dot(a, w2, acc2, FP32)
    return acc, acc2


@triton.jit
def _tma_loop(a_desc, w_desc, w2_desc, off_m, off_n, K, acc, acc2, BLOCK_K: tl.constexpr, PAIR: tl.constexpr):
    for k0 in range(0, K, BLOCK_K):
        a = a_desc.load([off_m, k0])
        acc = tl.dot(a, w_desc.load([off_n, k0]).T, acc)
        if PAIR:
            acc2 = tl.dot(a, w2_desc.load([off_n, k0]).T, acc2)
    return acc, acc2


@triton.jit
def _dot(a, w, acc, FP32: tl.constexpr):
    if FP32:  # tf32 would cost the fp32 path its exactness (the golden tests run it)
        return tl.dot(a, tl.trans(w), acc, input_precision="ieee")
    return tl.dot(a, tl.trans(w), acc)


@triton.jit
def _weight_tile(ptrs, k, K, col_mask, EVEN_K: tl.constexpr, W_FP8: tl.constexpr, dtype: tl.constexpr):
    """A (BLOCK_N, BLOCK_K) tile of W in the activation dtype; FP8 bit patterns are converted in registers."""
    if EVEN_K:
        w = tl.load(ptrs, mask=col_mask, other=0)
    else:
        w = tl.load(ptrs, mask=col_mask & (k < K)[None, :], other=0)
    return decode_weights(w, W_FP8).to(dtype)


@triton.jit
def row_scale(acc, s_ptr, cols, N, W_FP8: tl.constexpr):
    """E4M3 weights carry one fp32 scale per output column of the tile (a row of W)."""
    if W_FP8 == 2:
        acc = acc * tl.load(s_ptr + cols, mask=cols < N, other=0.0)[None, :]
    return acc


@dataclass(frozen=True)
class TileConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    group_m: int = 8


def tile_config(table: dict[int, TileConfig], m: int, k: int, elem_bytes: int = 2) -> TileConfig:
    """The launch for the smallest tabled row count >= m (the largest past the end); tiles shrink to the data.
    The tables are for 2-byte activations; fp32 ones (the exact path the golden tests run) get half as deep
    K tiles, so the pipeline's buffers still fit in shared memory."""
    if INTERPRET:  # numpy runs one program at a time: few, large programs
        return TileConfig(min(64, dot_dim(m)), 32, min(64, dot_dim(k)), 4, 1)
    cfg = next((table[bound] for bound in sorted(table) if m <= bound), table[max(table)])
    block_k = min(cfg.block_k * 2 // elem_bytes, dot_dim(k))
    return TileConfig(min(cfg.block_m, dot_dim(m)), cfg.block_n, block_k, cfg.num_warps, cfg.num_stages, cfg.group_m)


# Fewest rows for TMA loads, and for making their descriptors on the host. H100, 7B bf16, time to first token
# (min of 14, scripts/experiments/tile_ab_dev.txt): at 512 tokens 12.98 ms with TMA loads (descriptors made on the
# device) against 14.11 with pointer loads; at 4,000 tokens 100.13 ms with host descriptors against 103.17 with
# device ones (each program builds and fences its own). Host descriptors are encoded at every launch, and were
# measured when they also went through triton's own launch path (launcher.py): too slow for the host below 1,024
# rows then.
TMA_MIN_ROWS = 512
HOST_DESCRIPTOR_ROWS = 1024


def use_tma(x: torch.Tensor, w: torch.Tensor) -> bool:
    """TMA tile loads (Hopper and newer) for 2-byte activations and weights of the same dtype, with 16-byte
    aligned rows, from TMA_MIN_ROWS rows; FP8 weights, fp32 and the interpreter take the pointer loads. H100,
    7B bf16: SwiGLU 996.6 us = 724 TFLOP/s at 4000 tokens against 1224.8 us with pointer loads
    (scripts/experiments/tma_probe.txt)."""
    if INTERPRET or not x.is_cuda or x.dtype not in (torch.bfloat16, torch.float16) or w.dtype != x.dtype:
        return False
    if x.shape[0] < TMA_MIN_ROWS:
        return False
    aligned = all(t.stride(1) == 1 and t.stride(0) * 2 % 16 == 0 and t.data_ptr() % 16 == 0 for t in (x, w))
    return aligned and _hopper(x.device.index)


@functools.cache
def _hopper(device: int) -> bool:
    return torch.cuda.get_device_capability(device) >= (9, 0)


def operands(x: torch.Tensor, ws: list[torch.Tensor], cfg: TileConfig) -> tuple[list, int]:
    """[x, *ws] as the kernel takes them and its TMA mode (dot_tiles): the tensors and 0 without TMA loads; host
    tensor descriptors of (BLOCK_M, BLOCK_K) and (BLOCK_N, BLOCK_K) tiles and 1; or the tensors and 2."""
    if not use_tma(x, ws[0]):
        return [x, *ws], 0
    if x.shape[0] < HOST_DESCRIPTOR_ROWS:
        _install_scratch_allocator()
        return [x, *ws], 2
    from triton.tools.tensor_descriptor import TensorDescriptor

    descs = [TensorDescriptor.from_tensor(x, [cfg.block_m, cfg.block_k])]
    return descs + [TensorDescriptor.from_tensor(w, [cfg.block_n, cfg.block_k]) for w in ws], 1


@functools.cache
def _install_scratch_allocator() -> None:
    """Descriptors made on the device live in global scratch memory that triton asks its allocator for."""
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, device="cuda", dtype=torch.int8))


def launch(cfg: TileConfig, m: int, n: int) -> dict:
    """The grid and the meta-parameters every tiled kernel takes."""
    return {
        "grid": (cdiv(m, cfg.block_m) * cdiv(n, cfg.block_n),),
        "meta": {"BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k, "GROUP_M": cfg.group_m,
                 "num_warps": cfg.num_warps, "num_stages": cfg.num_stages},
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


def matmul(x, w: Weight, residual, out, configs: dict[int, TileConfig]) -> None:
    """out = x @ w.T (+ residual): the tiled loop with a plain epilogue, launched from the table `configs`."""
    (m, k), n = x.shape, w.shape[0]
    cfg = tile_config(configs, m, k, x.element_size())
    run = launch(cfg, m, n)
    (a, wt), tma = operands(x, [w.data], cfg)
    _LINEAR[run["grid"]](
        a, wt, scale_arg(w), out if residual is None else residual, out, m, n, k, x.stride(0),
        w.data.stride(0), RESIDUAL=residual is not None, EVEN_K=k % cfg.block_k == 0, W_FP8=w_fp8(w),
        FP32=x.dtype == torch.float32, TMA=tma, **run["meta"],
    )
