"""The persistent decode step's task walk on the device (decode_step.py): which (layer, op, tile) task t is and where
a layer's tensors lie (decode_step_plan.program_tasks mirrors the walk on the host)."""

from __future__ import annotations

import triton
import triton.language as tl


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
