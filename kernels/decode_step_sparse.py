"""The sparse FFN inside the persistent decode step (decode_step.py): its three ops per layer, their tiles, the
tensors each layer adds to the offset table, and the task body, which runs the per-op sparse kernels' tiles.

    select   the router's rows (or W1's, in whole groups: gate mode) flag groups; the last select task to finish
             (a ticket) compacts the flags into the count and the ascending list of active groups
    gather   gate and up rows of one listed group (tasks past the count do nothing)
    scatter  a share of the listed groups over a block of columns of the transposed down projection; the last
             share of a column block (a ticket) writes out = x + the shares' partial rows, in order

Each task waits for the op before it on the step's counters (decode_step.py), so the tickets only order tasks of
one op. The tiles are sparse_ffn's launch table's (and sparse_select's), as the per-op kernels take them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from llamafast.config import SparseMode, Weight

from ._common import cdiv, next_pow2
from .counters import wait_count
from .decode_step_tasks import at
from .sparse_ffn import CONFIGS as FFN_CONFIGS, ffn_tiles, gather_tile, scatter_tile
from .sparse_select import CONFIGS as ROUTER_CONFIGS, gate_tile, router_tile, select_tiles

SPARSE_OPS = ("qkv", "attention", "wo", "select", "gather", "scatter")  # per layer, in dependency order
SPARSE_TENSORS = ("router", "router_bias", "threshold", "work")  # table columns after FLAGS (decode_step_plan)
MODE_CODES = {SparseMode.router: 1, SparseMode.gate: 2}  # the kernel's SPARSE (0: a dense FFN)


@dataclass(frozen=True)
class SparseLayer:
    """A layer's sparse FFN state beside its weights (model.set_sparsity): the router (n_groups, C) in the model
    dtype and its fp32 bias, the fp32 threshold (1,), and sparse_select's int32 work (count, tickets, list)."""

    router: torch.Tensor
    router_bias: torch.Tensor
    threshold: torch.Tensor
    work: torch.Tensor


@dataclass(frozen=True)
class SparseTiles:
    """The step's sparse FFN: mode, group size and count, select tiles (router rows; W1 rows in whole groups),
    gather tiles (rows of one group), the scatter's shares and column block."""

    mode: SparseMode
    group: int
    n_groups: int
    select: tuple[int, int]
    gather: tuple[int, int]
    splits: int
    block_c: int

    def tasks(self, c: int, f: int) -> tuple[int, int, int]:
        """Tasks of select, gather and scatter in one layer."""
        rows = self.n_groups if self.mode == SparseMode.router else f
        return cdiv(rows, self.select[0]), f // self.gather[0], self.splits * cdiv(c, self.block_c)


def sparse_tiles(w1: Weight, router: torch.Tensor, group: int, mode: SparseMode) -> SparseTiles:
    """The tiles the per-op kernels launch with on their committed tables (sparse_ffn.ffn_tiles,
    sparse_select.select_tiles)."""
    f, c = w1.shape
    cfg, gather, block_c = ffn_tiles(FFN_CONFIGS, w1, group)
    sel, rows = select_tiles(ROUTER_CONFIGS, w1, router, group, mode)
    return SparseTiles(mode, group, f // group, (rows, sel.block_k), gather, cfg.splits, block_c)


def sparse_offsets(layer: SparseLayer | None, first: SparseLayer | None) -> list[int]:
    """A layer's SPARSE_TENSORS columns: element offsets from the first layer's (none where it has no sparse FFN)."""
    assert (layer is None) == (first is None), "every layer has a sparse FFN, or none"
    if layer is None:
        return []
    pairs = [(getattr(layer, n), getattr(first, n)) for n in SPARSE_TENSORS]
    assert all(a.dtype == b.dtype and a.is_contiguous() for a, b in pairs), "layers' sparse FFN tensors: one dtype"
    offsets = [(a.data_ptr() - b.data_ptr()) // a.element_size() for a, b in pairs]
    assert offsets[0] % 16 == 0, "layers' routers: 16 elements apart (the kernel's loads are vectors of up to 16)"
    return offsets


@dataclass(frozen=True)
class SparseScratch:
    """A row per layer (SR fp32): SiLU(gate) (gate mode) at 0 and SiLU(gate) * up in list order at HR (F each,
    padded to 128-byte lines), the scatter's partial rows (SPLITS x C) at 2 HR; meta: the kernel's sparse
    constexprs (SPARSE 0: a dense FFN)."""

    rows: torch.Tensor | None
    meta: dict


def sparse_scratch(tiles: SparseTiles | None, n_layers: int, c: int, f: int, device) -> SparseScratch:
    if tiles is None:
        meta = dict.fromkeys(("G", "N_GROUPS", "BN_SEL", "BK_SEL", "BN_GAT", "BK_GAT", "SPLITS", "BLOCK_C",
                              "BLOCK_ALL"), 1)
        return SparseScratch(None, {**meta, "SPARSE": 0, "T_X": 0, "HR": 0, "SR": 0})
    h_row = cdiv(f, 32) * 32
    row = 2 * h_row + cdiv(tiles.splits * c, 32) * 32
    meta = dict(SPARSE=MODE_CODES[tiles.mode], T_X=tiles.tasks(c, f)[2], G=tiles.group, N_GROUPS=tiles.n_groups,
                BN_SEL=tiles.select[0], BK_SEL=tiles.select[1], BN_GAT=tiles.gather[0], BK_GAT=tiles.gather[1],
                SPLITS=tiles.splits, BLOCK_C=tiles.block_c, BLOCK_ALL=next_pow2(tiles.n_groups), HR=h_row, SR=row)
    return SparseScratch(torch.zeros(n_layers * row, device=device, dtype=torch.float32), meta)


def sparse_args(first: SparseLayer | None, scratch: SparseScratch, dummy: torch.Tensor) -> tuple:
    """The kernel's sparse pointers: layer 0's router, bias, threshold and work, then the scratch (dummy where the
    FFN is dense: the kernel compiles without them)."""
    assert (first is None) == (scratch.rows is None), "the sparse FFN's tiles where the layers have its tensors"
    tensors = (None,) * 4 if first is None else (first.router, first.router_bias, first.threshold, first.work)
    return tuple(dummy if t is None else t for t in (*tensors, scratch.rows))


@triton.jit
def sparse_task(wait_ptr, wait_target, watchdog_ptr, WAIT: tl.constexpr, op, tile, off, x_ptr, g_ptr, w1_ptr,
                w3_ptr, s1_ptr, s3_ptr, w2t_ptr, s2_ptr, r_ptr, rb_ptr, thr_ptr, work_ptr, row_ptr, out_ptr,
                C: tl.constexpr, F: tl.constexpr, S_FFN: tl.constexpr, S_W2: tl.constexpr, eps, MODE: tl.constexpr,
                G: tl.constexpr, N_GROUPS: tl.constexpr, T_SEL: tl.constexpr, BN_SEL: tl.constexpr,
                BK_SEL: tl.constexpr, BN_GAT: tl.constexpr, BK_GAT: tl.constexpr, SPLITS: tl.constexpr,
                BLOCK_C: tl.constexpr, BLOCK_ALL: tl.constexpr, HR: tl.constexpr, W_FP8: tl.constexpr):
    """Task `tile` of op 3 (select), 4 (gather) or 5 (scatter) of one layer, once *wait_ptr >= wait_target: x is
    the layer's residual after wo, out its output row, off its row of the offset table (decode_step_plan), the
    weights' and SPARSE_TENSORS' pointers layer 0's, row_ptr the layer's SparseScratch row."""
    if WAIT:
        wait_count(wait_ptr, wait_target, watchdog_ptr)
    g_ptr += at(off, 11)
    w1_ptr += at(off, 2)
    w3_ptr += at(off, 3)
    s1_ptr += at(off, 7)
    s3_ptr += at(off, 8)
    w2t_ptr += at(off, 4)
    s2_ptr += at(off, 9)
    r_ptr += at(off, 20)
    rb_ptr += tl.load(off + 21)
    thr_ptr += tl.load(off + 22)
    work_ptr += tl.load(off + 23)
    act_ptr, h_ptr, part_ptr = row_ptr, row_ptr + HR, row_ptr + 2 * HR
    if op == 3:
        if MODE == 1:  # the router: float weights in the model dtype
            router_tile(tile, T_SEL, x_ptr, g_ptr, r_ptr, rb_ptr, thr_ptr, work_ptr, N_GROUPS, C, eps, BN_SEL,
                        BK_SEL, C % BK_SEL == 0, 0, BLOCK_ALL)
        else:
            gate_tile(tile, T_SEL, x_ptr, g_ptr, w1_ptr, s1_ptr, thr_ptr, work_ptr, act_ptr, F, C, S_FFN, eps, G,
                      BN_SEL, BK_SEL, C % BK_SEL == 0, W_FP8, BLOCK_ALL)
    elif op == 4:
        gather_tile(tile, x_ptr, g_ptr, w1_ptr, w3_ptr, s1_ptr, s3_ptr, act_ptr, work_ptr, h_ptr, C, S_FFN, eps, G,
                    BN_GAT, BK_GAT, C % BK_GAT == 0, W_FP8, MODE == 2)
    else:
        NB: tl.constexpr = (C + BLOCK_C - 1) // BLOCK_C
        scatter_tile(tile // NB, tile % NB, h_ptr, w2t_ptr, s2_ptr, x_ptr, work_ptr, part_ptr, out_ptr, C, S_W2,
                     N_GROUPS, G, SPLITS, BLOCK_C, C % BLOCK_C == 0, W_FP8)
