"""Router-sparse FFN for one decode token: gate and up rows of the active neuron groups only, SiLU(gate) * up,
then those neurons' rows of the transposed down projection summed into the output.

    out = x + sum over active groups g of  (SiLU(W1[g] . h) * (W3[g] . h)) @ W2t[g]        h = norm(x)

sparse_select.py first leaves the count and the ascending list of active groups in `work`. Then, on fixed grids
(the step is captured in a CUDA graph) whose programs past the count exit at once or find no work:
  gather   program p takes rows of the (p / (G / BLOCK_N))-th listed group (a group's G rows of W1 and W3 are
           contiguous: neurons were permuted into groups at calibration) and writes SiLU(gate) * up in list order;
  scatter  program (k, b) walks the k-th of SPLITS shares of the listed groups over BLOCK_C output columns,
           one (G, BLOCK_C) tile of W2t (F, C: one contiguous row per neuron, as in LTE's kernel)
           per group, into a partial row; the last of the SPLITS programs of a column block to finish writes
           out = x + the partial rows, in order (a separate reduction kernel cost 1.6 us and a launch per layer).
Weights: float, FP8, or block formats (gate and up any of them, against int8 activations as gemv_int8 takes them;
W2t then Q8_0 along C, one fp16 scale per 32 columns of a row: llamafast/sparse/blocks.py).
The sum is the same on every run (no atomic adds of values). Measured on the way here (H100, 7B, bf16, half the
groups; scripts/experiments/sparse/): one fused kernel per group (gate, up and down in each program, fp32 atomic adds)
reached 62% of the copy bandwidth and 34% with FP8 weights; a scatter with one program per 32 listed neurons
and 256 columns took 33 us for 45 MB (each program one large tile: too few programs resident per SM to cover
memory latency), and its atomic adds cost more as the programs grew more numerous (rows of 8: 160-250 us).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from llamafast.config import SPARSE_COLUMN_BLOCKS, SparseMode, Weight, WeightFormat

from ._common import cdiv, check_vector, check_weight, decode_weights, next_pow2, scale_arg, w_fp8
from .gemv import dot_rows, gemv_key
from .sparse_select import select_groups


@dataclass(frozen=True)
class SparseConfig:
    block_n: int  # gather: neurons per program (a power of two; at most the group size)
    block_k: int  # gather: C tile of the gate/up loop
    num_warps: int  # gather
    splits: int  # scatter: programs along the listed groups (partial rows summed by the reduction)
    block_c: int  # scatter: output columns per program
    scatter_warps: int


# (F, C, bytes per weight) -> launch, router mode's winners (gate mode shares them). H100, 7B, half the groups
# (scripts/results/sparse/tune_7b.json): 60.7 us for the whole sparse FFN in bf16 (the dense FFN's kernels:
# 99.5 us), 42.0 us with E5M2 weights (dense 55.8 us). Untuned shapes take DEFAULT.
CONFIGS: dict[tuple[int, int, int], SparseConfig] = {
    (11008, 4096, 2): SparseConfig(block_n=16, block_k=256, num_warps=8, splits=32, block_c=128, scatter_warps=1),
    (11008, 4096, 1): SparseConfig(block_n=4, block_k=1024, num_warps=4, splits=32, block_c=128, scatter_warps=1),
}
DEFAULT = SparseConfig(block_n=2, block_k=512, num_warps=1, splits=16, block_c=64, scatter_warps=1)


def ffn_tiles(table: dict, w1: Weight, group_size: int) -> tuple[SparseConfig, tuple[int, int], int]:
    """The launch for w1 (F, C) in table (else DEFAULT), the gather's (rows, K) tile within one group and the
    scatter's column block: what sparse_ffn launches and the persistent step's tasks take
    (decode_step_sparse.sparse_tiles)."""
    f, c = w1.shape
    cfg = table.get(gemv_key(w1), DEFAULT)
    block_c = min(cfg.block_c, next_pow2(c))
    assert cdiv(c, block_c) <= SPARSE_COLUMN_BLOCKS, f"{cdiv(c, block_c)} column blocks: BLOCK_C too small for C"
    return cfg, (min(cfg.block_n, group_size), min(cfg.block_k, next_pow2(c))), block_c


@triton.jit
def gather_tile(pid, x_ptr, g_ptr, w1_ptr, w3_ptr, s1_ptr, s3_ptr, act_ptr, work_ptr, h_ptr, C, stride_wn, eps,
                G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                W_FP8: tl.constexpr, GATE_GIVEN: tl.constexpr):
    """h[j] = SiLU(gate) * up for the j-th listed neuron: tile pid takes rows of the (pid / (G / BLOCK_N))-th
    listed group; tiles past the count do nothing."""
    slot = pid // (G // BLOCK_N)
    group = tl.load(work_ptr + 4 + slot)  # issued beside the count, not after it: one wait, not two
    if slot < tl.load(work_ptr):
        sub = (pid % (G // BLOCK_N)) * BLOCK_N + tl.arange(0, BLOCK_N)
        rows = group * G + sub
        every = rows >= 0
        if GATE_GIVEN:
            up, _, ss = dot_rows(w3_ptr, w3_ptr, s3_ptr, s3_ptr, x_ptr, g_ptr, rows, every, C, stride_wn,
                                 BLOCK_N, BLOCK_K, True, False, EVEN_K, W_FP8)
            a = tl.load(act_ptr + rows)
        else:
            gate, up, ss = dot_rows(w1_ptr, w3_ptr, s1_ptr, s3_ptr, x_ptr, g_ptr, rows, every, C, stride_wn,
                                    BLOCK_N, BLOCK_K, True, True, EVEN_K, W_FP8)
            a = gate * tl.rsqrt(ss / C + eps)
            a = a * tl.sigmoid(a)
        h = a * up * tl.rsqrt(ss / C + eps)
        h = h.to(g_ptr.dtype.element_ty).to(tl.float32)  # the dense path's intermediate is in the model dtype too
        tl.store(h_ptr + slot * G + sub, h)


@triton.jit
def scatter_tile(k, b, h_ptr, w2t_ptr, s2_ptr, x_ptr, work_ptr, part_ptr, out_ptr, C, stride_w2, n_groups,
                 G: tl.constexpr, SPLITS: tl.constexpr, BLOCK_C: tl.constexpr, EVEN_C: tl.constexpr,
                 W_FP8: tl.constexpr):
    """partial[k, c] = sum over the k-th share of the listed groups, i over a group's G neurons, of
    h[slot * G + i] * W2t[group * G + i, c], for BLOCK_C columns c of block b: one (G, BLOCK_C) tile per listed
    group, the next group's id loaded beside the tile, so each step waits on memory once. The last of a column
    block's SPLITS tiles to finish (a ticket, as in sparse_select._compact) writes out = x + its partials, in
    order."""
    c = b * BLOCK_C + tl.arange(0, BLOCK_C)
    i = tl.arange(0, G)
    count = tl.load(work_ptr)
    per = tl.cdiv(count, SPLITS)
    first, last = k * per, tl.minimum(k * per + per, count)
    acc = tl.zeros((G, BLOCK_C), dtype=tl.float32)
    group = tl.load(work_ptr + 4 + first, mask=first < last, other=0)
    for slot in range(first, last):
        following = tl.load(work_ptr + 5 + slot, mask=slot + 1 < last, other=0)
        ptrs = w2t_ptr + (group * G + i)[:, None].to(tl.int64) * stride_w2 + c[None, :]
        if EVEN_C:
            w = tl.load(ptrs, eviction_policy="evict_first")
        else:
            w = tl.load(ptrs, mask=(c < C)[None, :], other=0, eviction_policy="evict_first")
        if W_FP8 == 3:  # Q8_0 rows along C: one fp16 scale per 32 columns, applied before the sum over i
            scales = s2_ptr + (group * G + i)[:, None].to(tl.int64) * (C // 32) + (c // 32)[None, :]
            w = w.to(tl.float32) * tl.load(scales, mask=(c < C)[None, :], other=0.0).to(tl.float32)
        else:
            w = decode_weights(w, W_FP8).to(tl.float32)
        acc += w * tl.load(h_ptr + slot * G + i)[:, None]
        group = following
    part = tl.sum(acc, axis=0)
    if W_FP8 == 2:  # E4M3: W2t's scales are per output column
        part = part * tl.load(s2_ptr + c, mask=c < C, other=0.0)
    tl.store(part_ptr + k * C + c, part, mask=c < C)
    tl.debug_barrier()  # every thread's partial stores precede the release below
    ticket_ptr = work_ptr + 4 + 2 * n_groups + b
    if tl.atomic_add(ticket_ptr, 1, sem="acq_rel") == SPLITS - 1:
        ks = tl.arange(0, SPLITS)
        parts = tl.load(part_ptr + ks[:, None] * C + c[None, :], mask=(c < C)[None, :], other=0.0, volatile=True)
        x = tl.load(x_ptr + c, mask=c < C, other=0.0).to(tl.float32)
        tl.store(out_ptr + c, (x + tl.sum(parts, axis=0)).to(out_ptr.dtype.element_ty), mask=c < C)
        tl.store(ticket_ptr, 0)


@triton.jit
def _gather_kernel(
    x_ptr, g_ptr, w1_ptr, w3_ptr, s1_ptr, s3_ptr, act_ptr, work_ptr, h_ptr,  # h (F,) fp32, in list order
    C, stride_wn, eps,
    G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, W_FP8: tl.constexpr,
    GATE_GIVEN: tl.constexpr,
):
    gather_tile(tl.program_id(0), x_ptr, g_ptr, w1_ptr, w3_ptr, s1_ptr, s3_ptr, act_ptr, work_ptr, h_ptr, C,
                stride_wn, eps, G, BLOCK_N, BLOCK_K, EVEN_K, W_FP8, GATE_GIVEN)


@triton.jit
def _scatter_kernel(
    h_ptr, w2t_ptr, s2_ptr, x_ptr, work_ptr, part_ptr, out_ptr,  # h (F,) fp32 in list order; partials (SPLITS, C)
    C, stride_w2, n_groups,
    G: tl.constexpr, SPLITS: tl.constexpr, BLOCK_C: tl.constexpr, EVEN_C: tl.constexpr, W_FP8: tl.constexpr,
):
    scatter_tile(tl.program_id(0), tl.program_id(1), h_ptr, w2t_ptr, s2_ptr, x_ptr, work_ptr, part_ptr, out_ptr, C,
                 stride_w2, n_groups, G, SPLITS, BLOCK_C, EVEN_C, W_FP8)


def check_group_size(group_size: int, hidden_dim: int) -> None:
    assert group_size >= 1 and group_size & (group_size - 1) == 0, "group size: a power of two (a tile side)"
    assert hidden_dim % group_size == 0, f"group size {group_size} does not divide the FFN width {hidden_dim}"


def sparse_ffn(x, norm_w, w1: Weight, w3: Weight, w2t: Weight, router_w, router_b, threshold, work, eps, group_size,
               mode, configs=None):
    """Same contract as llamafast.reference.sparse_ffn for one token: x (1, C) -> (1, C)."""
    f, c = w1.shape
    check_group_size(group_size, f)
    check_vector("x", x, c)
    for name, w in (("w1", w1), ("w3", w3), ("w2t", w2t)):
        check_weight(name, w, c)
        assert w.shape == (f, c), f"{name}: ({f}, {c}) like w1"
    assert w3.fmt == w1.fmt and w3.data.dtype == w1.data.dtype, "w1 and w3: the same weight format"
    assert w2t.fmt == (WeightFormat.q8_0 if w1.fmt.is_block else w1.fmt), "W2t: w1's format, or Q8_0 for blocks"
    w2t_scale = w2t.scale
    if w2t.fmt == WeightFormat.fp8_e4m3:
        assert w2t_scale.shape == (c,) and w2t_scale.dtype == torch.float32, "E4M3 W2t: (C,) column scales"
    cfg, (block_n, block_k), block_c = ffn_tiles(CONFIGS if configs is None else configs, w1, group_size)
    act = select_groups(x, norm_w, w1, router_w, router_b, threshold, work, eps, group_size, mode)
    h = torch.empty(f, device=x.device, dtype=torch.float32)
    _gather_kernel[(f // block_n,)](
        x, norm_w, w1.data, w3.data, scale_arg(w1), scale_arg(w3), w1.data if act is None else act,
        work, h, c, w1.data.stride(0), eps, G=group_size, BLOCK_N=block_n, BLOCK_K=block_k, EVEN_K=c % block_k == 0,
        W_FP8=w_fp8(w1), GATE_GIVEN=mode == SparseMode.gate, num_warps=cfg.num_warps,
    )
    parts = torch.empty((cfg.splits, c), device=x.device, dtype=torch.float32)
    out = torch.empty_like(x)
    _scatter_kernel[(cfg.splits, cdiv(c, block_c))](
        h, w2t.data, scale_arg(w2t), x, work, parts, out, c, w2t.data.stride(0), f // group_size,
        G=group_size, SPLITS=cfg.splits, BLOCK_C=block_c, EVEN_C=c % block_c == 0,
        W_FP8=w_fp8(w2t) if w2t.fmt.is_block else w_fp8(w1),  # (E4M3's W2t scales are per column, w1's per row)
        num_warps=cfg.scatter_warps,
    )
    return out
