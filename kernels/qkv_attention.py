"""RMSNorm + QKV + RoPE + KV-cache write, then attention, in one kernel, for one decode token at short contexts.

    q, k, v = rmsnorm_qkv_rope(x) at pos (k and v into the caches);  out[h] = softmax(q[h] . K[kv(h), :L] / sqrt(D))
    @ V[kv(h), :L],   L = pos + 1

The programs are rmsnorm_qkv_rope.py's row tiles. Each then takes a ticket on its KV head (a head's tiles: its
GROUP query heads' rows, its k rows and its v rows), and the head's last tile to finish attends the head's group
over the whole cache in one program (decode_attention.attention_split, WHOLE), so no attention kernel runs between
this one and wo's GEMV. On an H200 at 7B, leaving attention out of the graphed step saved 5.8-6.7 µs a layer, for
a kernel of about 2.8 (scripts/experiments/op_cost/): the rest is the boundary, attention launched without PDL
between two GEMVs under it. A lone program's walk grows with L, so the host runs this kernel while L <= SHORT_LEN
and the two kernels beyond (Engine keys its decode graphs by it).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from llamafast.config import Weight

from ._common import cdiv, dot_dim, scale_arg
from .decode_attention import attention_split, tickets
from .gemv import gemv_config, launch_args
from .rmsnorm_qkv_rope import CONFIGS, check_args, qkv_rope_tile, qkv_rows, tail_args
from .quantize_activation import gemv_input

SHORT_LEN = 256  # positions up to which the fused kernel runs
BLOCK_S = 16  # positions a step of the tail's walk: its K and V tiles stay in the GEMV's registers
STAGES = 2  # steps of the walk in flight (tl.range's software pipeline): one program walks the whole cache


@triton.jit
def _qkv_attention_kernel(
    x_ptr, g_ptr, w_ptr, s_ptr, cos_ptr, sin_ptr, pos_ptr,  # as rmsnorm_qkv_rope's
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, ticket_ptr,  # q (H*D,) scratch; out (H*D,); a ticket per KV head
    N, C, QD, KVD, stride_wn, stride_ch, stride_cs, eps, sm_scale, tiles_per_head,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, W_FP8: tl.constexpr,
    GROUP: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, FP32: tl.constexpr,
    STAGES: tl.constexpr, PDL: tl.constexpr = False,
    t_ptr=None, ts_ptr=None, split=0, stride_tn=0, T_FMT: tl.constexpr = -1,
):
    tile = tl.program_id(0)
    qkv_rope_tile(
        tile, x_ptr, g_ptr, w_ptr, s_ptr, cos_ptr, sin_ptr, pos_ptr, q_ptr, k_cache_ptr, v_cache_ptr,
        N, C, QD, KVD, stride_wn, stride_ch, stride_cs, eps, HEAD_DIM, BLOCK_N, BLOCK_K, EVEN_K, W_FP8,
        PDL=PDL, t_ptr=t_ptr, ts_ptr=ts_ptr, split=split, stride_tn=stride_tn, T_FMT=T_FMT,
    )
    r0 = tile * BLOCK_N  # a tile's rows lie in one head (BLOCK_N divides HEAD_DIM)
    kvh = tl.where(r0 < QD, r0 // (GROUP * HEAD_DIM), (r0 - QD) % KVD // HEAD_DIM)
    tl.debug_barrier()  # every thread's q, k and v stores precede the release below
    ticket = tl.atomic_add(ticket_ptr + kvh, 1, sem="acq_rel", scope="gpu")
    if ticket == tiles_per_head - 1:
        tl.atomic_xchg(ticket_ptr + kvh, 0, sem="relaxed", scope="gpu")  # zero again for the next call
        if GROUP == 1:
            _attend_head(kvh, q_ptr, k_cache_ptr, v_cache_ptr, pos_ptr, out_ptr, stride_ch, stride_cs, sm_scale,
                         HEAD_DIM, BLOCK_D, BLOCK_S, STAGES)
        else:
            attention_split(kvh, 0, q_ptr, k_cache_ptr, v_cache_ptr, pos_ptr, out_ptr, out_ptr, stride_ch, stride_cs,
                            1, sm_scale, ticket_ptr, out_ptr, GROUP, HEAD_DIM, BLOCK_G, BLOCK_D, BLOCK_S, BLOCK_S,
                            FP32, 1, WHOLE=True, STAGES=STAGES)


@triton.jit
def _attend_head(h, q_ptr, k_ptr, v_ptr, pos_ptr, out_ptr, stride_ch, stride_cs, sm_scale, HEAD_DIM: tl.constexpr,
                 BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, STAGES: tl.constexpr):
    """Head h's output when it has its KV head to itself (GROUP 1): products summed in fp32 without tl.dot, whose
    16-row minimum took a 2-warp 7B launch from 80 to 124 registers a thread (sm_90a)."""
    length = tl.load(pos_ptr) + 1
    d = tl.arange(0, BLOCK_D)
    q = tl.load(q_ptr + h * HEAD_DIM + d, mask=d < HEAD_DIM, other=0.0).to(tl.float32)
    m = tl.full((), float("-inf"), tl.float32)
    l = tl.zeros((), tl.float32)
    acc = tl.zeros((BLOCK_D,), tl.float32)
    base = h.to(tl.int64) * stride_ch
    for s0 in tl.range(0, length, BLOCK_S, num_stages=STAGES):
        s = s0 + tl.arange(0, BLOCK_S)
        mask = (s < length)[:, None] & (d < HEAD_DIM)[None, :]
        offs = base + s[:, None] * stride_cs + d[None, :]
        k = tl.load(k_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        scores = tl.where(s < length, tl.sum(k * q[None, :], axis=1) * sm_scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=0))
        p = tl.exp(scores - m_new)
        alpha = tl.exp(m - m_new)
        v = tl.load(v_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        l = l * alpha + tl.sum(p, axis=0)
        m = m_new
    tl.store(out_ptr + h * HEAD_DIM + d, (acc / l).to(out_ptr.dtype.element_ty), mask=d < HEAD_DIM)


def qkv_attention(x, norm_w, wqkv: Weight, cos, sin, pos, k_cache, v_cache, eps, configs=None):
    """reference.rmsnorm_qkv_rope then reference.attention for one token, in one kernel: x (1, C) -> (1, H*D).
    configs: rmsnorm_qkv_rope's launch table (its tiles, narrowed to divide D)."""
    n, c = wqkv.shape
    kvh, smax, d = k_cache.shape
    qd = n - 2 * kvh * d
    group = qd // d // kvh
    check_args(x, norm_w, wqkv, cos, sin, k_cache, v_cache)
    cfg = gemv_config(CONFIGS if configs is None else configs, wqkv)
    head, tail = wqkv.head, wqkv.tail
    block_n = qkv_rows(cfg.block_n, wqkv)
    while d % block_n:
        block_n //= 2
    q = torch.empty((1, qd), device=x.device, dtype=x.dtype)
    out = torch.empty((1, qd), device=x.device, dtype=x.dtype)
    _qkv_attention_kernel[(cdiv(n, block_n),)](
        gemv_input(x, wqkv, cfg, norm_w), norm_w, head.data, scale_arg(head), cos, sin, pos, q, k_cache, v_cache, out,
        tickets(x.device, kvh, "qkv_attention"), n, c, qd, kvh * d, head.data.stride(0), k_cache.stride(0),
        k_cache.stride(1), eps, d**-0.5, (group + 2) * d // block_n,
        HEAD_DIM=d, GROUP=group, BLOCK_G=dot_dim(group), BLOCK_D=dot_dim(d), BLOCK_S=BLOCK_S,
        FP32=x.dtype == torch.float32, STAGES=STAGES, **launch_args(cfg, head, block_n, pdl=tail is None),
        **tail_args(head, tail),
    )
    return out
