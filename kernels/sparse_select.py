"""The first half of the sparse FFN decode step: which neuron groups run for this token, compacted on the device.

    router: active[g] = sigmoid(R[g] . norm(x) + b[g]) > threshold        (R: (n, C), one row per group)
    gate:   a = SiLU(W1 . norm(x)) for every neuron (dense); active[g] = sum over g's neurons of |a| > threshold

Each program scores its rows (the GEMV loop of gemv.py, RMSNorm fused) and writes one flag per group; the last
program to finish (a ticket taken with an acq_rel atomic after a CTA barrier) turns the flags into the count and
the ascending list of active ids, so the list is the same on every run, and resets the ticket for the next call.
No host sync: the FFN kernels (sparse_ffn.py) read the count and list on the device. Compacting in each reader
instead (every FFN program loading the flags and taking a prefix sum) was slower: 72.8 against 64.5 us for the
whole 7B FFN at half sparsity in bf16 (scripts/experiments/sparse/tune_listed_7b.json, tune_split_7b.json).
work (int32): [count, ticket, calls, groups run so far, ids (n), flags (n), scatter tickets], sparse_work_size(n).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from llamafast.config import SparseMode, Weight, sparse_work_size

from ._common import cdiv, check_rows, check_vector, check_weight, next_pow2, scale_arg
from .gemv import GemvConfig, dot_rows, gemv_config, gemv_key, launch_args

# (rows, C, bytes per weight) -> launch: the router (n groups x C) and, in gate mode, W1 (F x C; the program's
# rows are whole groups). H100, 7B (scripts/results/sparse/tune_7b.json): the router's selection 6.3 us alone (its
# GEMV reads 2.8 MB; launch and the compaction tail are most of it); the gate's 36-38 us in bf16 (W1 is 90 MB,
# scripts/experiments/sparse/tune_split_7b.json). Untuned shapes take gemv_config's default or GATE_DEFAULT.
CONFIGS: dict[tuple[int, int, int], GemvConfig] = {
    (344, 4096, 2): GemvConfig(block_n=4, block_k=2048, num_warps=4),
}
GATE_DEFAULT = GemvConfig(block_n=32, block_k=256, num_warps=4)


def select_tiles(table: dict, w1: Weight, router_w: torch.Tensor, group_size: int,
                 mode: SparseMode) -> tuple[GemvConfig, int]:
    """The selection's launch in table and its rows per program: the router's (gemv_config), or in gate mode
    W1's (else GATE_DEFAULT) in whole groups. What select_groups launches and the persistent step's select tasks
    take (decode_step_sparse.sparse_tiles)."""
    if mode == SparseMode.router:
        cfg = gemv_config(table, router_w)
        return cfg, cfg.block_n
    f, c = w1.shape
    cfg = table.get(gemv_key(w1), GATE_DEFAULT)
    return cfg, max(group_size, cfg.block_n // group_size * group_size)


@triton.jit
def _compact(work_ptr, n_groups, arrivals, BLOCK_ALL: tl.constexpr):
    """The last of the arrivals (programs, or the persistent step's tasks) compacts every one's flags into the
    count and the list of ids."""
    tl.debug_barrier()  # every thread's flag stores precede the release below
    ticket = tl.atomic_add(work_ptr + 1, 1, sem="acq_rel")
    if ticket == arrivals - 1:
        ids = tl.arange(0, BLOCK_ALL)
        valid = ids < n_groups
        flags = tl.load(work_ptr + 4 + n_groups + ids, mask=valid, other=0, volatile=True)
        slot = tl.cumsum(flags, 0) - flags
        tl.store(work_ptr + 4 + slot, ids, mask=valid & (flags != 0))
        count = tl.sum(flags, 0)
        tl.store(work_ptr, count)
        tl.store(work_ptr + 1, 0)
        tl.atomic_add(work_ptr + 2, 1, sem="relaxed")  # fire and forget: no load to wait for
        tl.atomic_add(work_ptr + 3, count, sem="relaxed")


@triton.jit
def router_tile(p, arrivals, x_ptr, g_ptr, r_ptr, b_ptr, thr_ptr, work_ptr, n_groups, C, eps, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, W_FP8: tl.constexpr, BLOCK_ALL: tl.constexpr):
    """Rows p * BLOCK_N.. of the router: their groups' flags, then the compaction if this is the last arrival."""
    rows = p * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = rows < n_groups
    s, _, ss = dot_rows(r_ptr, r_ptr, r_ptr, r_ptr, x_ptr, g_ptr, rows, mask, C, C, BLOCK_N, BLOCK_K, True, False,
                        EVEN_K, W_FP8)
    score = tl.sigmoid(s * tl.rsqrt(ss / C + eps) + tl.load(b_ptr + rows, mask=mask, other=0.0))
    active = (score > tl.load(thr_ptr)) & mask
    tl.store(work_ptr + 4 + n_groups + rows, active.to(tl.int32), mask=mask)
    _compact(work_ptr, n_groups, arrivals, BLOCK_ALL)


@triton.jit
def gate_tile(p, arrivals, x_ptr, g_ptr, w1_ptr, s1_ptr, thr_ptr, work_ptr, act_ptr, F, C, stride_wn, eps,
              G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
              W_FP8: tl.constexpr, BLOCK_ALL: tl.constexpr):
    """Rows p * BLOCK_N.. of W1 (whole groups: BLOCK_N is a multiple of G): SiLU(gate) into act, their groups'
    flags, then the compaction if this is the last arrival."""
    rows = p * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = rows < F
    gate, _, ss = dot_rows(w1_ptr, w1_ptr, s1_ptr, s1_ptr, x_ptr, g_ptr, rows, mask, C, stride_wn, BLOCK_N, BLOCK_K,
                           True, False, EVEN_K, W_FP8)
    a = gate * tl.rsqrt(ss / C + eps)
    a = a * tl.sigmoid(a)
    tl.store(act_ptr + rows, a, mask=mask)
    mass = tl.sum(tl.reshape(tl.abs(a), (BLOCK_N // G, G)), axis=1)
    groups = p * (BLOCK_N // G) + tl.arange(0, BLOCK_N // G)
    n_groups = F // G
    active = (mass > tl.load(thr_ptr)) & (groups < n_groups)
    tl.store(work_ptr + 4 + n_groups + groups, active.to(tl.int32), mask=groups < n_groups)
    _compact(work_ptr, n_groups, arrivals, BLOCK_ALL)


@triton.jit
def _router_kernel(
    x_ptr, g_ptr, r_ptr, b_ptr, thr_ptr, work_ptr,  # x, g (C,); router (n, C), bias (n,); threshold (1,)
    n_groups, C, eps,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, W_FP8: tl.constexpr,
    BLOCK_ALL: tl.constexpr,
):
    router_tile(tl.program_id(0), tl.num_programs(0), x_ptr, g_ptr, r_ptr, b_ptr, thr_ptr, work_ptr, n_groups, C,
                eps, BLOCK_N, BLOCK_K, EVEN_K, W_FP8, BLOCK_ALL)


@triton.jit
def _gate_kernel(
    x_ptr, g_ptr, w1_ptr, s1_ptr, thr_ptr, work_ptr, act_ptr,  # act (F,) fp32: SiLU(gate), for sparse_ffn
    F, C, stride_wn, eps, G: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, W_FP8: tl.constexpr,
    BLOCK_ALL: tl.constexpr,
):
    gate_tile(tl.program_id(0), tl.num_programs(0), x_ptr, g_ptr, w1_ptr, s1_ptr, thr_ptr, work_ptr, act_ptr, F, C,
              stride_wn, eps, G, BLOCK_N, BLOCK_K, EVEN_K, W_FP8, BLOCK_ALL)


def select_groups(x, norm_w, w1: Weight, router_w, router_b, threshold, work, eps, group_size, mode, configs=None):
    """Fills work with this token's active groups (x (1, C)). Returns SiLU(gate) (F,) fp32 in gate mode, else None."""
    f, c = w1.shape
    n = f // group_size
    check_vector("x", x, c)
    check_vector("norm_w", norm_w, c)
    check_vector("threshold", threshold, 1)
    assert work.dtype == torch.int32 and work.numel() == sparse_work_size(n), "work: int32, sparse_work_size(n)"
    table = CONFIGS if configs is None else configs
    common = {"BLOCK_ALL": next_pow2(n)}
    if mode == SparseMode.router:
        check_rows("router_w", router_w, c)
        assert router_w.shape[0] == n and router_b.shape == (n,) and router_b.dtype == torch.float32, "router: (n, C)"
        cfg, block_n = select_tiles(table, w1, router_w, group_size, mode)
        grid = cdiv(n, block_n)
        _router_kernel[(grid,)](
            x, norm_w, router_w, router_b, threshold, work, n, c, eps, **common,
            **launch_args(cfg, Weight(router_w)),
        )
        return None
    check_weight("w1", w1, c)
    cfg, block_n = select_tiles(table, w1, router_w, group_size, mode)
    act = torch.empty(f, device=x.device, dtype=torch.float32)
    grid = cdiv(f, block_n)
    _gate_kernel[(grid,)](
        x, norm_w, w1.data, scale_arg(w1), threshold, work, act,
        f, c, w1.data.stride(0), eps, G=group_size, **common,
        **{k: v for k, v in launch_args(cfg, w1, block_n).items() if k != "FLOAT_BLOCKS"},  # int8 x for blocks
    )
    return act
