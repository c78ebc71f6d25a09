"""The persistent decode step's task walk on the device (decode_step.py): which (layer, op, tile) task t is, where
a layer's tensors lie and in which format (decode_step_plan.program_tasks mirrors the walk on the host)."""

from __future__ import annotations

import triton
import triton.language as tl

from .linear_residual import linear_residual_tile
from .rmsnorm_swiglu import swiglu_tile


@triton.jit
def at(off, column):
    """Where a layer's tensor starts, in elements from layer 0's (offset_table): a multiple of 16, so the loads
    from it stay 16 bytes wide (an offset read from memory carries no alignment the compiler can see)."""
    return tl.multiple_of(tl.load(off + column), 16)


@triton.jit
def step_task(t, T_QKV: tl.constexpr, T_ATT: tl.constexpr, T_WO: tl.constexpr, T_FFN: tl.constexpr,
              T_W2: tl.constexpr, T_X: tl.constexpr):
    """Task t of the walk: (layer, op in OPS order, tile within the op, task count of the op it waits on). T_X:
    the tasks of a sixth op (the sparse FFN's scatter; 0: none)."""
    T_LAYER: tl.constexpr = T_QKV + T_ATT + T_WO + T_FFN + T_W2 + T_X
    layer = t // T_LAYER
    r = t - layer * T_LAYER
    op = r * 0
    tile = r
    n_dep = r * 0 + (T_X if T_X > 0 else T_W2)
    if r >= T_QKV:
        op, tile, n_dep = 1, r - T_QKV, T_QKV
    if r >= T_QKV + T_ATT:
        op, tile, n_dep = 2, r - T_QKV - T_ATT, T_ATT
    if r >= T_QKV + T_ATT + T_WO:
        op, tile, n_dep = 3, r - T_QKV - T_ATT - T_WO, T_WO
    if r >= T_QKV + T_ATT + T_WO + T_FFN:
        op, tile, n_dep = 4, r - T_QKV - T_ATT - T_WO - T_FFN, T_FFN
    if T_X > 0:
        if r >= T_QKV + T_ATT + T_WO + T_FFN + T_W2:
            op, tile, n_dep = 5, r - T_QKV - T_ATT - T_WO - T_FFN - T_W2, T_W2
    return layer, op, tile, n_dep


@triton.jit
def alt_format(off, column, FB: tl.constexpr):
    """Whether the layer's weight is in its second format FB (the table's flag): False at compile time where
    there is none, so the kernel compiles one tile body."""
    alt = False
    if FB >= 0:
        alt = tl.load(off + column) != 0
    return alt


@triton.jit
def linear_task(alt, tile, x_ptr, w_ptr, s_ptr, res_ptr, out_ptr, N, K, BN: tl.constexpr, BK: tl.constexpr,
                F: tl.constexpr, S: tl.constexpr, FB: tl.constexpr, SB: tl.constexpr, wait_ptr, wait_target,
                watchdog_ptr, WAIT: tl.constexpr, STAGES: tl.constexpr):
    """linear_residual_tile on weights in format F (row stride S), or FB (SB) where alt."""
    if alt:
        linear_residual_tile(tile, x_ptr, w_ptr, s_ptr, res_ptr, out_ptr, N, K, SB, BN, BK, K % BK == 0, FB,
                             wait_ptr=wait_ptr, wait_target=wait_target, watchdog_ptr=watchdog_ptr, WAIT=WAIT,
                             PREFETCH=STAGES)
    else:
        linear_residual_tile(tile, x_ptr, w_ptr, s_ptr, res_ptr, out_ptr, N, K, S, BN, BK, K % BK == 0, F,
                             wait_ptr=wait_ptr, wait_target=wait_target, watchdog_ptr=watchdog_ptr, WAIT=WAIT,
                             PREFETCH=STAGES)


@triton.jit
def swiglu_task(alt, tile, x_ptr, g_ptr, w1_ptr, w3_ptr, s1_ptr, s3_ptr, out_ptr, F, C, eps, BN: tl.constexpr,
                BK: tl.constexpr, FMT: tl.constexpr, S: tl.constexpr, FB: tl.constexpr, SB: tl.constexpr, wait_ptr,
                wait_target, watchdog_ptr, WAIT: tl.constexpr, STAGES: tl.constexpr, p_ptr, xo_ptr,
                PARTS: tl.constexpr, share, SHARES: tl.constexpr):
    """swiglu_tile on gate and up weights in format FMT (row stride S), or FB (SB) where alt; with PARTS, x plus
    the ranks' parts (decode_step_tp.py)."""
    if alt:
        swiglu_tile(tile, x_ptr, g_ptr, w1_ptr, w3_ptr, s1_ptr, s3_ptr, out_ptr, F, C, SB, eps, BN, BK, C % BK == 0,
                    FB, wait_ptr=wait_ptr, wait_target=wait_target, watchdog_ptr=watchdog_ptr, WAIT=WAIT,
                    PREFETCH=STAGES)
    else:
        swiglu_tile(tile, x_ptr, g_ptr, w1_ptr, w3_ptr, s1_ptr, s3_ptr, out_ptr, F, C, S, eps, BN, BK, C % BK == 0,
                    FMT, p_ptr, xo_ptr, PARTS, wait_ptr=wait_ptr, wait_target=wait_target, watchdog_ptr=watchdog_ptr,
                    WAIT=WAIT, PREFETCH=STAGES, share=share, SHARES=SHARES)
