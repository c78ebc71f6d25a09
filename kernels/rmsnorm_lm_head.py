"""Final RMSNorm + LM head for one decode token: logits = (x * rsqrt(mean(x^2) + eps) * g) @ W.T, in fp32.

The same fused-norm GEMV as rmsnorm_qkv_rope without the RoPE epilogue; logits stay fp32 for sampling.
Legend: C dim, V vocab. Llama-2-7B bf16: reads 262 MB of W (32000 x 4096), writes 128 KB of logits.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from llamafast.config import Weight

from ._common import cdiv, check_vector, check_weight, scale_arg
from .gemv import GemvConfig, dot_rows, gemv_config, launch_args
from .quantize_activation import gemv_input
from .tp_sync import Peers, consumer_args, push_rows, release_slot, signal_peers

# (V, C, bytes per weight) -> launch. H100 (scripts/results/tune_7b*.txt): 88.4 us = 2966 GB/s at 7B in bf16,
# 48.2 us = 2720 GB/s in FP8 (E5M2).
CONFIGS: dict[tuple[int, int, int], GemvConfig] = {
    (32000, 4096, 2): GemvConfig(block_n=8, block_k=1024, num_warps=8),
    (32000, 4096, 1): GemvConfig(block_n=32, block_k=256, num_warps=8),
    # Tensor-parallel shards (TP=2 at 7B, 13B and 70B), tuned on one H200 (scripts/results/tp/tune_tp2_*.json):
    (16000, 4096, 2): GemvConfig(block_n=8, block_k=256, num_warps=1),  # 34.5 us
    (16000, 5120, 2): GemvConfig(block_n=8, block_k=512, num_warps=2),  # 41.8 us
    (16000, 8192, 2): GemvConfig(block_n=8, block_k=512, num_warps=2),  # 63.9 us, 70B
}
# An H200's own launches, chosen by the whole step of 7B, of 70B in FP8 and of TP=2 shards (kernels.ON_GPU says how).
H200: dict[tuple, GemvConfig] = {
    (32000, 4096, 1): GemvConfig(block_n=8, block_k=256, num_warps=1, pdl=True),
    (32000, 8192, 1): GemvConfig(block_n=2, block_k=512, num_warps=2, pdl=True),  # 70B
    # TP=2 shards, 7B and 13B. Under symm the LM head also adds the ranks' partials, which every program reads
    # whole: more, smaller programs read them more often, so that path keeps the launch it had.
    (16000, 4096, 2): GemvConfig(block_n=2, block_k=256, num_warps=1),
    (16000, 5120, 2): GemvConfig(block_n=4, block_k=256, num_warps=2),
    (16000, 4096, 2, "summed"): CONFIGS[(16000, 4096, 2)],
    (16000, 5120, 2, "summed"): CONFIGS[(16000, 5120, 2)],
}
# An H100's own launches, chosen by the whole 7B step (kernels.ON_GPU says how).
H100: dict[tuple, GemvConfig] = {
    (32000, 4096, 1): dataclasses.replace(CONFIGS[(32000, 4096, 1)], pdl=True),
}


@triton.jit
def _rmsnorm_lm_head_kernel(
    x_ptr, g_ptr, w_ptr, s_ptr, out_ptr,  # x (C,), g (C,), W (V, C), E4M3 scales (V,), logits (V,) fp32
    V, C, stride_wn, eps,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, W_FP8: tl.constexpr,
    p_ptr=None, xo_ptr=None, f_ptr=None, PARTS: tl.constexpr = 0,  # tensor parallel: x + partials (tp_sync.py)
    table_ptr=None, flags_table=None, counter_ptr=None, offset=0, flag_offset=0, WORLD: tl.constexpr = 0,  # push
    PDL: tl.constexpr = False,  # launched with programmatic dependent launch (gemv.use_pdl)
    FLOAT_BLOCKS: tl.constexpr = False,  # gemv.GemvConfig.float_blocks
):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = rows < V
    acc, _, ss = dot_rows(
        w_ptr, w_ptr, s_ptr, s_ptr, x_ptr, g_ptr, rows, mask, C, stride_wn, BLOCK_N, BLOCK_K, True, False, EVEN_K, W_FP8,
        p_ptr, xo_ptr, PARTS, PDL, f_ptr, PARTS, FLOAT_BLOCKS=FLOAT_BLOCKS,
    )
    logits = acc * tl.rsqrt(ss / C + eps)
    if WORLD > 0:  # a vocabulary shard: into every rank's logits row
        push_rows(logits, rows, mask, table_ptr, offset, WORLD)
    else:
        tl.store(out_ptr + rows, logits, mask=mask)
    if PARTS > 0:
        release_slot(f_ptr, tl.num_programs(0))
    if WORLD > 0:
        signal_peers(counter_ptr, flags_table, flag_offset, tl.num_programs(0), WORLD)


def rmsnorm_lm_head(x: torch.Tensor, norm_w: torch.Tensor, w: Weight, eps: float, configs=None,
                    push: tuple[Peers, int] | None = None):
    """Same contract as llamafast.reference.rmsnorm_lm_head for one token: x (1, C) -> logits (1, V) fp32; x may
    be a tp_sync.SummedInput. push=(peers, slot): w is this rank's vocabulary shard, and its logits go into every
    rank's peers.logits (tp_sync.wait_logits returns the whole row); returns None then."""
    x, parts = consumer_args(x)
    summed = bool(parts)
    if push is not None:
        peers, slot = push
        parts.update(table_ptr=peers.logits_table, flags_table=peers.flags_table, counter_ptr=peers.counters[slot:],
                     offset=peers.rank * w.shape[0], flag_offset=slot * 2, WORLD=peers.world)
    v, c = w.shape
    check_vector("x", x, c)
    check_vector("norm_w", norm_w, c)
    check_weight("w", w, c)
    out = torch.empty((1, v), device=x.device, dtype=torch.float32)
    cfg = gemv_config(CONFIGS if configs is None else configs, w, summed=summed)
    _rmsnorm_lm_head_kernel[(cdiv(v, cfg.block_n),)](
        gemv_input(x, w, cfg, norm_w), norm_w, w.data, scale_arg(w), out, v, c, w.data.stride(0), eps,
        **launch_args(cfg, w, pdl=True),
        **parts,
    )
    return None if push is not None else out
