"""Every layer of one decode token in one persistent kernel: resident programs walk a task list in dependency order.

    for each layer: qkv tiles -> attention splits (+ merge) -> wo tiles -> gate/up tiles -> w2 tiles
    (a sparse FFN: wo tiles -> select tiles -> gather tiles -> scatter tiles, decode_step_sparse.py)

The per-op graph launches about 5 kernels per layer, each paying its ramp-up, tail and partial last wave. Here a
grid of co-resident programs (SMs x programs per SM, checked at launch) takes the tasks (layer, op, tile) of the
whole step round-robin in topological order, running the per-op kernels' tile bodies. A task reads its first
weight tile, then waits on the counter of the op it depends on (counters.py: a volatile spin, one acquire), so the
next op's weight stream starts while the current op's last tiles finish; a program reports its tasks of an op with
one release when it moves on. Round-robin over a topological order cannot deadlock when every program is
resident: the lowest unfinished task has every input done, and its program has nothing before it. Each layer has
its own activation rows, padded to 128 bytes, so no SM holds a stale L1 line of one: every row is written once
per launch, before any program reads it. The counters (and the attention merge's tickets) are zeroed inside the
CUDA graph before each launch. The LM head and sampling run after the kernel. Block-format tiles run the per-op
GEMVs' int8 loop, each rounding its own slice of the activations (gemv_int8.py); where layers mix block formats
(decode_step_plan.formats_refusal), a flag per layer picks the tile body of its weight's format.
SEQUENTIAL (the interpreter): one program walks the list in order, so no task waits. STAMPS: each task's start
and end on the GPU's clock (DecodeStep.stamped). L layers, C dim, F hidden, H heads, KVH kv heads, D head_dim.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import globaltimer

from ._common import cdiv
from .decode_step_args import resident_grid, step_args
from .counters import report_done, wait_count
from .attention_merge import merge_blocks
from .decode_attention import attention_config, attention_split
from .decode_step_plan import (CONFIGS, OPS, LayerTensors, StepConfig, even_split, offset_table, op_tasks,
                               row_elems, step_config, step_formats, step_key)
from .decode_step_sparse import SPARSE_OPS, SparseTiles, sparse_scratch, sparse_task
from .decode_step_tasks import alt_format, at, linear_task, step_task, swiglu_task
from .decode_step_tp import StepPeers, push_task, summed_input
from .tp_sync import Peers, release_slot
from .rmsnorm_qkv_rope import qkv_rope_tile

__all__ = ["CONFIGS", "DecodeStep", "LayerTensors", "StepConfig"]

class DecodeStep:
    """The persistent kernel bound to one model's layers, caches and scratch: step(x, pos) -> the residual stream
    after the last layer, (1, C). Build it outside graph capture (it allocates); every call replays unchanged."""

    def __init__(self, layers: list[LayerTensors], cos: torch.Tensor, sin: torch.Tensor, n_heads: int, eps: float,
                 configs: dict | None = None, attention_configs: dict | None = None,
                 sparse: SparseTiles | None = None,  # the sparse FFN's tiles, where layers carry its tensors
                 peers: Peers | None = None):  # a tensor-parallel rank's (decode_step_tp.py)
        first = layers[0]
        self.layers, self.cos, self.sin, self.eps = layers, cos, sin, eps
        self.c, self.f, self.n_qkv = first.attn_norm.numel(), first.w1.shape[0], first.wqkv.shape[0]
        self.kvh, self.smax, self.d = first.k_cache.shape
        self.h, self.qd = n_heads, n_heads * self.d
        self.formats = step_formats(layers)
        dev, dt = first.k_cache.device, first.k_cache.dtype
        self.cfg = even_split(step_config(CONFIGS if configs is None else configs, step_key(self.c, self.f,
                                                                                           first.wqkv)), layers)
        att = attention_config(self.kvh, n_heads // self.kvh, attention_configs)
        self.split_len = att.split_len(self.smax)
        self.n_splits = cdiv(self.smax, self.split_len)
        self.merge = merge_blocks(n_heads // self.kvh, self.d, self.n_splits)
        self.block_s, n = att.block_s, len(layers)
        self.rows = {"x": row_elems(self.c, dt), "q": row_elems(self.qd, dt), "f": row_elems(self.f, dt)}
        # Row l + 1: layer l's output; row 0 unused on one GPU, the input as a tensor-parallel step stores it
        self.xs = torch.zeros((n + 1) * self.rows["x"], device=dev, dtype=dt)
        self.hs, self.qs, self.att, self.fs = (torch.zeros(n * self.rows[r], device=dev, dtype=dt) for r in "xqqf")
        self.part_row, self.lse_row = (row_elems(n_heads * self.n_splits * k, torch.float32) for k in (self.d, 1))
        self.part, self.lse = (torch.zeros(n * r, device=dev, dtype=torch.float32) for r in (self.part_row,
                                                                                             self.lse_row))
        self.counts_per_op = op_tasks(self.n_qkv, self.c, self.f, self.kvh, self.n_splits, self.cfg, sparse)
        self.ops = OPS if sparse is None else SPARSE_OPS
        self.sparse, self.sparse_bufs = sparse, sparse_scratch(sparse, n, self.c, self.f, dev)
        self.count_row = row_elems(len(self.ops) + self.kvh, torch.int32)
        self.counts = torch.zeros(n * self.count_row, device=dev, dtype=torch.int32)
        self.watchdog = torch.zeros(1, device=dev, dtype=torch.int32)
        self.table = offset_table(layers).to(dev)
        assert peers is None or (sparse is None and self.formats.qkv[0] <= 2), "tensor parallel: float or FP8, dense"
        self.tp = StepPeers(peers, n, self.c, dt, dev)
        # Set by the first call (GPU): programs in the grid, registers per thread of the kernel and spilled ones
        self.grid = self.n_regs = self.n_spills = None

    def __call__(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        assert x.is_contiguous() and x.numel() == self.c and x.dtype == self.xs.dtype, "x: (1, C) in the cache dtype"
        self.ready(x, pos)
        self.counts.zero_()
        args, meta = self._args(x, pos)
        _decode_step_kernel[(self.grid,)](*args, self.grid, **meta)
        n = len(self.layers)
        if self.tp.world:
            return self.tp.output(self.hs[(n - 1) * self.rows["x"]: (n - 1) * self.rows["x"] + self.c].view(1, self.c))
        return self.xs[n * self.rows["x"]: n * self.rows["x"] + self.c].view(1, self.c)

    def stamped(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """One step run eagerly (after a call has set the grid), each task stamped on the GPU's nanosecond clock:
        (tasks, 2) int64 start and end, tasks in the walk's order (layer, then OPS, then tile)."""
        stamps = torch.zeros((len(self.layers) * sum(self.counts_per_op), 2), device=x.device, dtype=torch.int64)
        self.counts.zero_()
        args, meta = self._args(x, pos, stamps)
        meta["STAMPS"] = True
        if self._programs(args, meta, record=False) < self.grid:  # its waits would deadlock
            raise RuntimeError("the stamped decode step kernel takes more registers than its grid leaves")
        _decode_step_kernel[(self.grid,)](*args, self.grid, **meta)
        return stamps

    def check_watchdog(self) -> bool:
        """True when some program gave up waiting on a counter since the step was built (waits on the GPU)."""
        return bool(self.watchdog.item())

    def _args(self, x, pos, stamps=None):
        return step_args(self, x, pos, stamps)

    def ready(self, x: torch.Tensor, pos: torch.Tensor) -> None:
        """Compiles the kernel and sizes its grid without launching it: a tensor-parallel rank's, before the
        ranks meet, so that none waits on a peer still compiling (backends._persistent_layers)."""
        if self.grid is None:
            self.grid = self._programs(*self._args(x, pos))

    def _programs(self, args, meta, record: bool = True) -> int:
        """Programs in the grid, every one resident at once (record: keep the kernel's registers)."""
        grid, regs = resident_grid(_decode_step_kernel, self, args, meta)
        if record:
            self.n_regs, self.n_spills = regs
        return grid


@triton.jit(do_not_specialize=["n_programs", "rank"])  # rank: every rank runs one compiled kernel
def _decode_step_kernel(
    x_ptr, xs_ptr, hs_ptr, qs_ptr, att_ptr, fs_ptr, part_ptr, lse_ptr, count_ptr, watchdog_ptr,  # input, scratch
    table_ptr, stamp_ptr,  # (L, TW) int64: offsets of each layer's tensors from the first's below, flags; stamps
    wqkv_ptr, wo_ptr, w1_ptr, w3_ptr, w2_ptr, sqkv_ptr, swo_ptr, s1_ptr, s3_ptr, s2_ptr, t_ptr, ts_ptr,
    r_ptr, rb_ptr, thr_ptr, wk_ptr, sr_ptr,  # sparse FFN: SPARSE_TENSORS of layer 0, the scratch rows
    pt_ptr, ft_ptr, pp_ptr, pf_ptr, tk_ptr, z_ptr, rank,  # tensor parallel (decode_step_tp.StepPeers)
    an_ptr, fn_ptr, kc_ptr, vc_ptr,
    cos_ptr, sin_ptr, pos_ptr, stride_ch, stride_cs, eps, sm_scale, n_programs,
    LAYERS: tl.constexpr, C: tl.constexpr, F: tl.constexpr, N_QKV: tl.constexpr, QD: tl.constexpr,
    KVD: tl.constexpr, KVH: tl.constexpr, HEAD_DIM: tl.constexpr, GROUP: tl.constexpr, N_SPLITS: tl.constexpr,
    XR: tl.constexpr, QR: tl.constexpr, FR: tl.constexpr, PR: tl.constexpr, LR: tl.constexpr, CR: tl.constexpr,
    TW: tl.constexpr,
    # Formats (WeightFormat.code, -1: none), row strides (StepFormats): wqkv's, its tail's, others' first and second
    F_QKV: tl.constexpr, S_QKV: tl.constexpr, F_T: tl.constexpr, S_T: tl.constexpr,
    F_WO: tl.constexpr, S_WO: tl.constexpr, FB_WO: tl.constexpr, SB_WO: tl.constexpr,
    F_FFN: tl.constexpr, S_FFN: tl.constexpr, FB_FFN: tl.constexpr, SB_FFN: tl.constexpr,
    F_W2: tl.constexpr, S_W2: tl.constexpr, FB_W2: tl.constexpr, SB_W2: tl.constexpr,
    T_QKV: tl.constexpr, T_ATT: tl.constexpr, T_WO: tl.constexpr, T_FFN: tl.constexpr,
    T_W2: tl.constexpr,  # tasks per op (op_tasks); with SPARSE, T_FFN, T_W2 and T_X are select, gather, scatter
    SPARSE: tl.constexpr, T_X: tl.constexpr, G: tl.constexpr, N_GROUPS: tl.constexpr, BN_SEL: tl.constexpr,  # sparse_
    BK_SEL: tl.constexpr, BN_GAT: tl.constexpr, BK_GAT: tl.constexpr, SPLITS: tl.constexpr, BLOCK_C: tl.constexpr,
    BLOCK_ALL: tl.constexpr, HR: tl.constexpr, SR: tl.constexpr,  # scratch's meta
    BN_QKV: tl.constexpr, BK_QKV: tl.constexpr, BN_WO: tl.constexpr, BK_WO: tl.constexpr,
    BN_FFN: tl.constexpr, BK_FFN: tl.constexpr, BN_W2: tl.constexpr, BK_W2: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, SPLIT_LEN: tl.constexpr,
    FP32: tl.constexpr, BLOCK_SPLITS: tl.constexpr, MERGE_G: tl.constexpr, MERGE_CHUNK: tl.constexpr,
    SEQUENTIAL: tl.constexpr, STAGES: tl.constexpr, WORLD: tl.constexpr,  # WORLD: ranks (0: one GPU)
    STAMPS: tl.constexpr = False,
):
    WAIT: tl.constexpr = not SEQUENTIAL
    T_LAYER: tl.constexpr = T_QKV + T_ATT + T_WO + T_FFN + T_W2 + T_X
    NOPS: tl.constexpr = 6 if SPARSE > 0 else 5
    SH_QKV: tl.constexpr = T_QKV if WORLD > 0 else 0  # tasks that share the store of the summed residual
    SH_FFN: tl.constexpr = T_FFN if WORLD > 0 else 0
    known = tl.program_id(0) * 0 - 1  # the latest op (layer * OPS + op) this program has seen complete
    pending = known * 0  # tasks of op pending_op done but not yet counted (counted once per op: one release)
    pending_op = known
    pending_ptr = count_ptr
    for t in range(tl.program_id(0), LAYERS * T_LAYER, n_programs):
        if STAMPS:
            tl.store(stamp_ptr + 2 * t, globaltimer())
        layer, op, tile, n_dep = step_task(t, T_QKV, T_ATT, T_WO, T_FFN, T_W2, T_X)
        off = table_ptr + layer * TW
        cnt = count_ptr + layer * CR
        x_in = x_ptr if layer == 0 else xs_ptr + layer * XR
        dep = layer * NOPS + op - 1  # the op this task's input comes from
        dep_ptr = count_ptr + (tl.maximum(dep, 0) // NOPS) * CR + tl.maximum(dep, 0) % NOPS
        target = tl.where(dep > known, n_dep, 0)
        p_in, slot = z_ptr, dep * 0 - 1
        if WORLD > 0:  # qkv and gate/up sum the ranks' parts, once their flag is up (decode_step_tp.py)
            x_in, p_in, dep_ptr, target, slot = summed_input(layer, op, x_in, x_ptr, xs_ptr, hs_ptr, dep_ptr, target,
                                                             pp_ptr, pf_ptr, z_ptr, XR, C, WORLD)
        known = tl.maximum(known, dep)  # (program_tasks mirrors this walk in Python)
        if WAIT:  # this program's finished tasks of its previous op, reported at once before any wait
            if (pending > 0) & (pending_op != dep + 1):
                report_done(pending_ptr, pending)
                pending = 0
        if op == 0:
            qkv_rope_tile(
                tile, x_in, an_ptr + at(off, 10), wqkv_ptr + at(off, 0), sqkv_ptr + at(off, 5),
                cos_ptr, sin_ptr, pos_ptr, qs_ptr + layer * QR, kc_ptr + at(off, 12), vc_ptr + at(off, 13),
                N_QKV, C, QD, KVD, S_QKV, stride_ch, stride_cs, eps, HEAD_DIM, BN_QKV, BK_QKV, C % BK_QKV == 0, F_QKV,
                wait_ptr=dep_ptr, wait_target=target, watchdog_ptr=watchdog_ptr, WAIT=WAIT, PREFETCH=STAGES,
                t_ptr=t_ptr + at(off, 14), ts_ptr=ts_ptr + at(off, 15), split=tl.load(off + 16), stride_tn=S_T,
                T_FMT=F_T, p_ptr=p_in, xo_ptr=xs_ptr + layer * XR, PARTS=WORLD, share=tile, SHARES=SH_QKV,
            )
        elif op == 1:
            if WAIT:
                wait_count(dep_ptr, target, watchdog_ptr)
            attention_split(
                tile // N_SPLITS, tile % N_SPLITS, qs_ptr + layer * QR, kc_ptr + at(off, 12),
                vc_ptr + at(off, 13), pos_ptr, part_ptr + layer * PR, lse_ptr + layer * LR, stride_ch, stride_cs,
                N_SPLITS, sm_scale, cnt + NOPS, att_ptr + layer * QR, GROUP, HEAD_DIM, BLOCK_G, BLOCK_D, BLOCK_S,
                SPLIT_LEN, FP32, BLOCK_SPLITS, MERGE_G, MERGE_CHUNK,
            )
        elif op == 2:
            if WORLD > 0:
                push_task(tile, att_ptr + layer * QR, wo_ptr + at(off, 1), swo_ptr + at(off, 6), C, QD, S_WO, BN_WO,
                          BK_WO, F_WO, dep_ptr, target, watchdog_ptr, WAIT, STAGES, pt_ptr, ft_ptr, tk_ptr, 2 * layer,
                          rank, WORLD, T_WO)
            else:
                linear_task(
                    alt_format(off, 17, FB_WO), tile, att_ptr + layer * QR, wo_ptr + at(off, 1), swo_ptr + at(off, 6),
                    x_in, hs_ptr + layer * XR, C, QD, BN_WO, BK_WO, F_WO, S_WO, FB_WO, SB_WO, dep_ptr, target,
                    watchdog_ptr, WAIT, STAGES,
                )
        elif SPARSE > 0:
            sparse_task(
                dep_ptr, target, watchdog_ptr, WAIT, op, tile, off, hs_ptr + layer * XR, fn_ptr, w1_ptr, w3_ptr, s1_ptr,
                s3_ptr, w2_ptr, s2_ptr, r_ptr, rb_ptr, thr_ptr, wk_ptr, sr_ptr + layer * SR, xs_ptr + (layer + 1) * XR,
                C, F, S_FFN, S_W2, eps, SPARSE, G, N_GROUPS, T_FFN, BN_SEL, BK_SEL, BN_GAT, BK_GAT, SPLITS, BLOCK_C,
                BLOCK_ALL, HR, F_FFN,
            )
        elif op == 3:
            swiglu_task(
                alt_format(off, 18, FB_FFN), tile, x_in if WORLD > 0 else hs_ptr + layer * XR, fn_ptr + at(off, 11),
                w1_ptr + at(off, 2), w3_ptr + at(off, 3), s1_ptr + at(off, 7), s3_ptr + at(off, 8),
                fs_ptr + layer * FR, F, C, eps, BN_FFN, BK_FFN, F_FFN, S_FFN, FB_FFN, SB_FFN, dep_ptr, target,
                watchdog_ptr, WAIT, STAGES, p_in, hs_ptr + layer * XR, WORLD, tile, SH_FFN,
            )
        elif WORLD > 0:
            push_task(tile, fs_ptr + layer * FR, w2_ptr + at(off, 4), s2_ptr + at(off, 9), C, F, S_W2, BN_W2, BK_W2,
                      F_W2, dep_ptr, target, watchdog_ptr, WAIT, STAGES, pt_ptr, ft_ptr, tk_ptr, 2 * layer + 1, rank,
                      WORLD, T_W2)
        else:
            linear_task(
                alt_format(off, 19, FB_W2), tile, fs_ptr + layer * FR, w2_ptr + at(off, 4), s2_ptr + at(off, 9),
                hs_ptr + layer * XR, xs_ptr + (layer + 1) * XR, C, F, BN_W2, BK_W2, F_W2, S_W2, FB_W2, SB_W2, dep_ptr,
                target, watchdog_ptr, WAIT, STAGES,
            )
        if WORLD > 0:
            if slot >= 0:  # its parts read: the op's last task lowers the flag
                release_slot(dep_ptr, tl.where(op == 0, T_QKV, T_FFN))
        pending += 1
        pending_op = dep + 1
        pending_ptr = cnt + op
        if STAMPS:
            tl.store(stamp_ptr + 2 * t + 1, globaltimer())
    if WAIT:
        if pending > 0:
            report_done(pending_ptr, pending)
