"""The persistent decode step's launch (decode_step.py's DecodeStep, bound to a model's layers): the kernel's
arguments and its grid."""

from __future__ import annotations

import torch

from ._common import INTERPRET, dot_dim, next_pow2, resident_programs, scale_arg
from .decode_step_plan import format_args, tail_tensors
from .decode_step_sparse import sparse_args


def step_args(step, x, pos, stamps=None) -> tuple[tuple, dict]:
    """_decode_step_kernel's arguments and meta-parameters for step (a DecodeStep) at x, pos (stamps: STAMPS's
    buffer, else none)."""
    first, cfg = step.layers[0], step.cfg
    args = (
        x, step.xs, step.hs, step.qs, step.att, step.fs, step.part, step.lse, step.counts, step.watchdog,
        step.table, step.counts if stamps is None else stamps,
        first.wqkv.data, first.wo.data, first.w1.data, first.w3.data, first.w2.data,
        scale_arg(first.wqkv), scale_arg(first.wo), scale_arg(first.w1), scale_arg(first.w3), scale_arg(first.w2),
        *tail_tensors(step.layers), *sparse_args(first.sparse, step.sparse_bufs, step.xs), *step.tp.args,
        first.attn_norm, first.ffn_norm, first.k_cache, first.v_cache, step.cos, step.sin, pos,
        first.k_cache.stride(0), first.k_cache.stride(1), step.eps, step.d ** -0.5,
    )
    meta = dict(
        LAYERS=len(step.layers), C=step.c, F=step.f, N_QKV=step.n_qkv, QD=step.qd, KVD=step.kvh * step.d,
        KVH=step.kvh, HEAD_DIM=step.d, GROUP=step.h // step.kvh, N_SPLITS=step.n_splits,
        XR=step.rows["x"], QR=step.rows["q"], FR=step.rows["f"], PR=step.part_row, LR=step.lse_row,
        CR=step.count_row, TW=step.table.shape[1], **format_args(step.formats),
        T_QKV=step.counts_per_op[0], T_ATT=step.counts_per_op[1], T_WO=step.counts_per_op[2],
        T_FFN=step.counts_per_op[3], T_W2=step.counts_per_op[4], **step.sparse_bufs.meta,
        BN_QKV=cfg.qkv[0], BK_QKV=cfg.qkv[1], BN_WO=cfg.wo[0], BK_WO=cfg.wo[1], BN_FFN=cfg.ffn[0],
        BK_FFN=cfg.ffn[1], BN_W2=cfg.w2[0], BK_W2=cfg.w2[1],
        BLOCK_G=dot_dim(step.h // step.kvh), BLOCK_D=dot_dim(step.d), BLOCK_S=step.block_s,
        SPLIT_LEN=step.split_len, FP32=step.xs.dtype == torch.float32, BLOCK_SPLITS=next_pow2(step.n_splits),
        MERGE_G=step.merge[0], MERGE_CHUNK=step.merge[1],
        SEQUENTIAL=INTERPRET, STAGES=cfg.stages, WORLD=step.tp.world, num_warps=cfg.num_warps,
    )
    if cfg.max_registers and not INTERPRET:
        meta["maxnreg"] = cfg.max_registers
    return args, meta


def resident_grid(kernel, step, args, meta) -> tuple[int, tuple]:
    """Programs in step's grid: every one resident at once, or the waits could deadlock; and the compiled kernel's
    (registers per thread, spilled ones)."""
    if INTERPRET:
        return 1, (None, None)
    compiled = kernel.warmup(*args, 1, grid=(1,), **meta)
    compiled._init_handles()
    fit = resident_programs(compiled, step.cfg.num_warps, step.xs.device)
    if fit < 1:
        raise RuntimeError(f"the decode step kernel cannot be resident: {compiled.n_regs} registers per thread")
    sms = torch.cuda.get_device_properties(step.xs.device).multi_processor_count
    grid = min(min(fit, step.cfg.programs_per_sm) * sms, sum(step.counts_per_op))
    return grid, (compiled.n_regs, compiled.n_spills)
