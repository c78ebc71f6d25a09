"""Causal FlashAttention-2 forward for a prompt chunk, reading K and V from the cache, with GQA.

    out[m, h] = softmax(q[m, h] . K[kv(h), :pos+m+1] / sqrt(D)) @ V[kv(h), :pos+m+1]

The prompt's queries sit at positions pos..pos+M-1 (pos read on the device: a chunk of a long prompt
attends to the chunks before it, already in the cache). Grid (query blocks, H): a program keeps its
(BLOCK_M, D) query tile and fp32 accumulator in registers and walks the cache in BLOCK_N blocks with an
online softmax in base 2 (the Triton tutorial 06-fused-attention). Keys up to pos + first row are visible
to every row, so that stretch runs without a mask; only the blocks on the diagonal are masked.
Query blocks are launched last-first: they have the most keys, and the short ones fill the tail.
D is padded to 16 for tl.dot (stories260K: head_dim 8). Legend: M queries, H heads, KVH kv heads, D head_dim.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .._common import INTERPRET, cdiv, dot_dim
from .launcher import Launcher

LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class FlashConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


# head_dim -> launch (`scripts/tune.py prefill`). H100, bf16: 15.6 us at 512 tokens and 309.8 us at 4,000, 7B
# heads (scripts/results/prefill_kernels_7b.txt, the run of record).
CONFIGS: dict[int, FlashConfig] = {128: FlashConfig(64, 64, 4, 3)}
DEFAULT = FlashConfig(64, 64, 4, 2)


@triton.jit
def _flash_attention_kernel(
    q_ptr, k_ptr, v_ptr, pos_ptr, o_ptr,  # q (M, H, D); caches (KVH, Smax, D); pos (); out (M, H*D)
    M, stride_qm, stride_qh, stride_ch, stride_cs, qk_scale,  # qk_scale = log2(e) / sqrt(D)
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, FP32: tl.constexpr,
):
    block = tl.num_programs(0) - 1 - tl.program_id(0)
    h = tl.program_id(1)
    pos = tl.load(pos_ptr)
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    d_mask = (d < HEAD_DIM)[None, :]
    q = tl.load(q_ptr + rows[:, None] * stride_qm + h * stride_qh + d[None, :], mask=(rows < M)[:, None] & d_mask,
                other=0.0)
    kv_base = (h // GROUP).to(tl.int64) * stride_ch
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    n = tl.arange(0, BLOCK_N)
    # Keys [0, full) are visible to every row of the block: no mask. Then the diagonal, up to the last row.
    full = (pos + block * BLOCK_M + 1) // BLOCK_N * BLOCK_N
    end = pos + tl.minimum(block * BLOCK_M + BLOCK_M, M)
    for start in range(0, full, BLOCK_N):
        acc, m_i, l_i = _attend(acc, m_i, l_i, q, k_ptr, v_ptr, kv_base, start + n, d, rows, pos, end,
                                stride_cs, qk_scale, HEAD_DIM, BLOCK_D, False, FP32)
    for start in range(full, end, BLOCK_N):
        acc, m_i, l_i = _attend(acc, m_i, l_i, q, k_ptr, v_ptr, kv_base, start + n, d, rows, pos, end,
                                stride_cs, qk_scale, HEAD_DIM, BLOCK_D, True, FP32)
    out = acc / l_i[:, None]
    o_offs = rows[:, None] * (tl.num_programs(1) * HEAD_DIM) + h * HEAD_DIM + d[None, :]
    tl.store(o_ptr + o_offs, out.to(o_ptr.dtype.element_ty), mask=(rows < M)[:, None] & d_mask)


_FLASH = Launcher(_flash_attention_kernel)


@triton.jit
def _attend(acc, m_i, l_i, q, k_ptr, v_ptr, kv_base, keys, d, rows, pos, end, stride_cs, qk_scale,
            HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, MASK: tl.constexpr, FP32: tl.constexpr):
    """One BLOCK_N block of keys folded into the running (acc, max, sum) of every row."""
    offs = kv_base + keys[:, None] * stride_cs + d[None, :]
    if MASK:
        kv_mask = (keys < end)[:, None] & (d < HEAD_DIM)[None, :]
    else:
        kv_mask = (d < HEAD_DIM)[None, :]
    if HEAD_DIM == BLOCK_D and not MASK:
        k = tl.load(k_ptr + offs)
    else:
        k = tl.load(k_ptr + offs, mask=kv_mask, other=0.0)
    if FP32:
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
    else:
        s = tl.dot(q, tl.trans(k)) * qk_scale  # (BLOCK_M, BLOCK_N) in log2 units
    if MASK:
        s = tl.where(keys[None, :] <= pos + rows[:, None], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if HEAD_DIM == BLOCK_D and not MASK:
        v = tl.load(v_ptr + offs)
    else:
        v = tl.load(v_ptr + offs, mask=kv_mask, other=0.0)
    if FP32:
        acc = tl.dot(p, v, acc * alpha[:, None], input_precision="ieee")
    else:
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, m_new, l_i


def flash_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pos: torch.Tensor, configs=None):
    """Same contract as llamafast.reference.attention: q (M, H, D) at positions pos.. -> (M, H*D)."""
    m, h, d = q.shape
    kvh, _, _ = k_cache.shape
    assert h % kvh == 0, f"{h} query heads do not divide into {kvh} kv heads"
    assert q.stride(2) == 1 and k_cache.stride() == v_cache.stride() and k_cache.stride(2) == 1, "D contiguous"
    out = torch.empty((m, h * d), device=q.device, dtype=q.dtype)
    cfg = (configs or CONFIGS).get(d, DEFAULT)
    block_m = min(cfg.block_m, dot_dim(m)) if not INTERPRET else 16
    _FLASH[(cdiv(m, block_m), h)](
        q, k_cache, v_cache, pos, out, m, q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
        LOG2E / d**0.5, GROUP=h // kvh, HEAD_DIM=d, BLOCK_D=dot_dim(d),
        BLOCK_M=block_m, BLOCK_N=16 if INTERPRET else cfg.block_n, FP32=q.dtype == torch.float32,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out
