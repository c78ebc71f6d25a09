"""The persistent decode step's task walk on the device (decode_step.py): which (layer, op, tile) task t is, where
a layer's tensors lie, and the L2 prefetch of a task's weights (decode_step_plan.program_tasks is its host mirror)."""

from __future__ import annotations

import triton
import triton.language as tl

from .gemv import rows_to_l2


@triton.jit
def at(off, column):
    """Where a layer's tensor starts, in elements from layer 0's (offset_table): a multiple of 16, so the loads
    from it stay 16 bytes wide (an offset read from memory carries no alignment the compiler can see)."""
    return tl.multiple_of(tl.load(off + column), 16)


@triton.jit
def step_task(t, T_QKV: tl.constexpr, T_ATT: tl.constexpr, T_WO: tl.constexpr, T_FFN: tl.constexpr,
              T_W2: tl.constexpr):
    """Task t of the walk: (layer, op in OPS order, tile within the op, task count of the op it waits on)."""
    T_LAYER: tl.constexpr = T_QKV + T_ATT + T_WO + T_FFN + T_W2
    layer = t // T_LAYER
    r = t - layer * T_LAYER
    op = r * 0
    tile = r
    n_dep = r * 0 + T_W2
    if r >= T_QKV:
        op, tile, n_dep = 1, r - T_QKV, T_QKV
    if r >= T_QKV + T_ATT:
        op, tile, n_dep = 2, r - T_QKV - T_ATT, T_ATT
    if r >= T_QKV + T_ATT + T_WO:
        op, tile, n_dep = 3, r - T_QKV - T_ATT - T_WO, T_WO
    if r >= T_QKV + T_ATT + T_WO + T_FFN:
        op, tile, n_dep = 4, r - T_QKV - T_ATT - T_WO - T_FFN, T_FFN
    return layer, op, tile, n_dep


@triton.jit
def task_to_l2(t, table_ptr, wqkv_ptr, wo_ptr, w1_ptr, w3_ptr, w2_ptr, N_QKV: tl.constexpr, C: tl.constexpr,
               F: tl.constexpr, QD: tl.constexpr, T_QKV: tl.constexpr, T_ATT: tl.constexpr, T_WO: tl.constexpr,
               T_FFN: tl.constexpr, T_W2: tl.constexpr, BN_QKV: tl.constexpr, BN_WO: tl.constexpr,
               BN_FFN: tl.constexpr, BN_W2: tl.constexpr):
    """Asks L2 for all of task t's weight rows (attention's tasks read none)."""
    layer, op, tile, _ = step_task(t, T_QKV, T_ATT, T_WO, T_FFN, T_W2)
    off = table_ptr + layer * 14
    if op == 0:
        _tile_to_l2(wqkv_ptr + at(off, 0), tile, N_QKV, C, BN_QKV)
    elif op == 2:
        _tile_to_l2(wo_ptr + at(off, 1), tile, C, QD, BN_WO)
    elif op == 3:
        _tile_to_l2(w1_ptr + at(off, 2), tile, F, C, BN_FFN)
        _tile_to_l2(w3_ptr + at(off, 3), tile, F, C, BN_FFN)
    elif op == 4:
        _tile_to_l2(w2_ptr + at(off, 4), tile, C, F, BN_W2)


@triton.jit
def _tile_to_l2(w_ptr, tile, N: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    rows_to_l2(w_ptr + rows[:, None].to(tl.int64) * K, rows < N, K, BLOCK_N)
