"""Decode attention for one query token: split-KV FlashAttention (flash-decoding) with GQA.

    out[h] = softmax(q[h] . K[kv(h), :L] / sqrt(D)) @ V[kv(h), :L],   L = pos + 1 (read on the device)

Grid (KVH, splits): a program takes all GROUP = H / KVH query heads of one KV head, so each K/V block is
read once for its whole group (Llama-2-70B: 8 heads per KV head), and one split of the sequence, walked
in BLOCK_S blocks with an online softmax; it writes its partial output and log-sum-exp. Programs whose
split starts past L exit at once, so the loop is bounded by the current length, not by the cache size,
while the grid stays fixed for CUDA graphs. Splits are cut from the cache's size, or, where the launch sets
min_split, from the current length (AttentionConfig). Each KV head's last split program to finish (it takes a ticket)
merges that head's used splits by their LSE, so no merge kernel follows: one kernel boundary less per layer,
+0.2% (bf16) and +0.4% (FP8 E5M2) decode tok/s at Llama-2-7B on the H100, +0.3% / +0.5% on the H200; it merges
every head of the group in one pass (attention_merge.py). While L fits one split (512 positions at 7B), split 0
writes the output itself: no partials, no ticket, no merge.
Scores use tl.dot with the group padded to 16 rows (and D to 16): wasted MMA work is free here, since the
kernel is bound by K/V reads. Legend: H heads, KVH kv heads, D head_dim, L length.
Llama-2-7B bf16 at L = 4096: reads 2 x 32 x 4096 x 128 x 2 B = 64 MiB of K/V per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ._common import cdiv, dot_dim, next_pow2, pdl_capable
from .attention_merge import merge_blocks, merge_head, merge_heads


@dataclass(frozen=True)
class AttentionConfig:
    n_splits: int  # programs per KV head for a full cache; the split length is a power of two >= block_s
    block_s: int  # positions per loop step
    num_warps: int
    # 0: each split holds split_len(cache size) positions, so a 4,096-position cache (chat's and serve's for Llama
    # 2) leaves every context up to 512 positions at 7B to one program a KV head. n > 0: the current length is cut
    # into the grid's splits of at least n positions, the length read on the device. On an H200
    # (scripts/experiments/attention_splits/), 7B FP8 with a 4,096-position cache: 2,502.1-2,503.8 -> 2,281.3-2,284.1
    # us a step after a 1,000-token prompt, 2,172.6-2,177.0 -> 2,139.3-2,142.8 after 16 tokens, with n = 32. Tuning
    # on first use picks n for the shapes no table holds (tuning.sweep.sweep_splits). The persistent step's
    # attention tasks keep splits of the cache's size.
    min_split: int = 0
    # Launched under programmatic dependent launch: it starts in RMSNorm + QKV's last wave, waits for it there, and
    # lets wo's GEMV launch at once. Chosen in the step by tuning on first use (tuning/__init__.py), since it wins
    # and loses by shape: one H100, one process (scripts/experiments/pdl_edges/h100/), SmolLM2's shape bf16
    # 387.2-387.6 -> 366.0-366.5 us a step, Q4_1 377.0-378.8 -> 366.2-366.7; 7B bf16 4,589.9-4,590.2 ->
    # 4,709.4-4,709.8, FP8 E5M2 2,618.8-2,619.6 -> 2,644.4-2,645.0 (letting wo launch only as attention's programs
    # end lost everywhere: 441.6-441.8, 4,622.4-4,622.5, 2,649.1-2,650.2).
    pdl: bool = False

    def split_len(self, smax: int) -> int:
        return max(self.block_s, next_pow2(cdiv(smax, self.n_splits)))


# (KVH, GROUP) -> launch. H100, bf16, 7B (scripts/results/tune_7b.txt): 8 splits of the cache were fastest
# at both 512 and 4096 positions (8.0 and 28.6 us, split kernel and merge together); block_s and warps
# changed little (28.6-29.9 us at 4096).
CONFIGS: dict[tuple[int, int], AttentionConfig] = {(32, 1): AttentionConfig(n_splits=8, block_s=32, num_warps=2)}
# An H200's and an H100's own: 7B's splits cut from the current length (min_split). On an H100, 7B in a
# 4,096-position cache (scripts/experiments/attention_splits/h100/): after 1,000 tokens bf16 4,952.5-4,958.2 ->
# 4,774.5-4,776.7 us a step and FP8 E5M2 2,973.8-2,984.4 -> 2,800.6-2,800.8; after 16, 4,623.0-4,623.3 ->
# 4,589.8-4,589.9 and 2,651.3-2,651.5 -> 2,619.4-2,619.5; in bench's cache of 280 positions, unchanged.
H200: dict[tuple[int, int], AttentionConfig] = {
    (32, 1): AttentionConfig(n_splits=8, block_s=32, num_warps=2, min_split=32),
}
H100 = H200
DEFAULT = AttentionConfig(n_splits=8, block_s=32, num_warps=2)

def attention_config(kvh: int, group: int, configs: dict[tuple[int, int], AttentionConfig] | None = None) -> AttentionConfig:
    """The tuned launch (configs, default CONFIGS), else default_config."""
    configs = configs or CONFIGS
    if (kvh, group) in configs:
        return configs[(kvh, group)]
    return default_config(kvh)


def default_config(kvh: int) -> AttentionConfig:
    """The launch for a shape no table holds: more splits for fewer KV heads, to give every SM work (70B: 8 KV
    heads -> 32 splits)."""
    return AttentionConfig(max(DEFAULT.n_splits, 256 // kvh), DEFAULT.block_s, DEFAULT.num_warps)


@triton.jit
def _decode_attention_split_kernel(
    q_ptr, k_ptr, v_ptr, pos_ptr, part_ptr, lse_ptr,  # q (H, D); caches (KVH, Smax, D); partials (H, S, D), (H, S)
    stride_ch, stride_cs, n_splits, sm_scale,  # cache strides (head, seq); splits; 1/sqrt(D)
    counter_ptr, out_ptr,  # a ticket per KV head (int32, zero between calls); out (H, D)
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr, SPLIT_LEN: tl.constexpr, FP32: tl.constexpr,
    BLOCK_SPLITS: tl.constexpr, MERGE_G: tl.constexpr, MERGE_CHUNK: tl.constexpr, MIN_SPLIT: tl.constexpr,
    PDL: tl.constexpr = False,  # AttentionConfig.pdl
):
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    attention_split(
        tl.program_id(0), tl.program_id(1), q_ptr, k_ptr, v_ptr, pos_ptr, part_ptr, lse_ptr, stride_ch, stride_cs,
        n_splits, sm_scale, counter_ptr, out_ptr, GROUP, HEAD_DIM, BLOCK_G, BLOCK_D, BLOCK_S, SPLIT_LEN, FP32,
        BLOCK_SPLITS, MERGE_G, MERGE_CHUNK, MIN_SPLIT,
    )


@triton.jit
def attention_split(
    kvh, split, q_ptr, k_ptr, v_ptr, pos_ptr, part_ptr, lse_ptr, stride_ch, stride_cs, n_splits, sm_scale,
    counter_ptr, out_ptr,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr, SPLIT_LEN: tl.constexpr, FP32: tl.constexpr, BLOCK_SPLITS: tl.constexpr,
    MERGE_G: tl.constexpr, MERGE_CHUNK: tl.constexpr,  # merge_blocks
    MIN_SPLIT: tl.constexpr = 0,  # AttentionConfig.min_split; 0: splits of SPLIT_LEN
):
    """One split of one KV head's sequence; the head's last split to finish merges the used ones."""
    length = tl.load(pos_ptr) + 1
    split_len = SPLIT_LEN
    if MIN_SPLIT > 0:  # at most n_splits splits hold length positions
        split_len = tl.maximum(tl.cdiv(tl.cdiv(length, n_splits), BLOCK_S) * BLOCK_S, MIN_SPLIT)
    used = tl.cdiv(length, split_len)  # splits holding positions; the rest have nothing to do
    if split < used:
        start = split * split_len
        end = tl.minimum(start + split_len, length)
        g = tl.arange(0, BLOCK_G)
        d = tl.arange(0, BLOCK_D)
        heads = kvh * GROUP + g
        q_mask = (g < GROUP)[:, None] & (d < HEAD_DIM)[None, :]
        q = tl.load(q_ptr + heads[:, None] * HEAD_DIM + d[None, :], mask=q_mask, other=0.0)  # (BLOCK_G, BLOCK_D)
        m = tl.full((BLOCK_G,), float("-inf"), dtype=tl.float32)
        l = tl.zeros((BLOCK_G,), dtype=tl.float32)
        acc = tl.zeros((BLOCK_G, BLOCK_D), dtype=tl.float32)
        base = kvh.to(tl.int64) * stride_ch
        for s0 in range(start, end, BLOCK_S):
            s = s0 + tl.arange(0, BLOCK_S)
            kv_mask = (s < end)[:, None] & (d < HEAD_DIM)[None, :]
            offs = base + s[:, None] * stride_cs + d[None, :]
            k = tl.load(k_ptr + offs, mask=kv_mask, other=0.0)  # (BLOCK_S, BLOCK_D)
            if FP32:  # tf32 would cost the fp32 path its exactness
                scores = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                scores = tl.dot(q, tl.trans(k))  # (BLOCK_G, BLOCK_S) fp32
            scores = scores * sm_scale
            scores = tl.where((s < end)[None, :], scores, float("-inf"))
            m_new = tl.maximum(m, tl.max(scores, axis=1))
            p = tl.exp(scores - m_new[:, None])
            alpha = tl.exp(m - m_new)
            v = tl.load(v_ptr + offs, mask=kv_mask, other=0.0)
            if FP32:
                acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            l = l * alpha + tl.sum(p, axis=1)
            m = m_new
        out = acc / l[:, None]  # a used split holds at least one position
        if used == 1:
            tl.store(out_ptr + heads[:, None] * HEAD_DIM + d[None, :], out.to(out_ptr.dtype.element_ty), mask=q_mask)
        else:
            row = heads * n_splits + split
            tl.store(part_ptr + row[:, None] * HEAD_DIM + d[None, :], out, mask=q_mask)
            tl.store(lse_ptr + row, m + tl.log(l), mask=g < GROUP)
            # The KV head's last program to finish merges its heads' splits.
            tl.debug_barrier()  # every thread's partials stored before the ticket releases them
            ticket = tl.atomic_add(counter_ptr + kvh, 1, sem="acq_rel", scope="gpu")
            if ticket == used - 1:
                tl.atomic_xchg(counter_ptr + kvh, 0, sem="relaxed", scope="gpu")  # zero again for the next call
                if GROUP == 1:
                    merge_head(part_ptr, lse_ptr, out_ptr, kvh, n_splits, used, HEAD_DIM, BLOCK_D, BLOCK_SPLITS)
                else:
                    merge_heads(part_ptr, lse_ptr, out_ptr, kvh, n_splits, used, GROUP, HEAD_DIM, BLOCK_D,
                                 BLOCK_SPLITS, MERGE_G, MERGE_CHUNK)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pos: torch.Tensor, configs=None):
    """Same contract as llamafast.reference.attention for one token: q (1, H, D) -> (1, H*D)."""
    _, h, d = q.shape
    kvh, smax, _ = k_cache.shape
    assert h % kvh == 0, f"{h} query heads do not group over {kvh} KV heads"
    assert q.is_contiguous() and k_cache.stride() == v_cache.stride() and k_cache.stride(2) == 1
    cfg = attention_config(kvh, h // kvh, configs)
    split_len = cfg.split_len(smax)
    n_splits = cdiv(smax, split_len)
    part = torch.empty((h, n_splits, d), device=q.device, dtype=torch.float32)
    lse = torch.empty((h, n_splits), device=q.device, dtype=torch.float32)
    out = torch.empty((1, h * d), device=q.device, dtype=q.dtype)
    merge_g, merge_chunk = merge_blocks(h // kvh, d, n_splits)
    _decode_attention_split_kernel[(kvh, n_splits)](
        q, k_cache, v_cache, pos, part, lse, k_cache.stride(0), k_cache.stride(1), n_splits, d**-0.5,
        tickets(q.device, kvh), out,
        GROUP=h // kvh, HEAD_DIM=d, BLOCK_G=dot_dim(h // kvh), BLOCK_D=dot_dim(d),
        BLOCK_S=cfg.block_s, SPLIT_LEN=split_len, FP32=q.dtype == torch.float32,
        BLOCK_SPLITS=next_pow2(n_splits), MERGE_G=merge_g, MERGE_CHUNK=merge_chunk, MIN_SPLIT=cfg.min_split,
        num_warps=cfg.num_warps,
        **({"PDL": True, "launch_pdl": True} if cfg.pdl and pdl_capable(q.device) else {}),
    )
    return out


_TICKETS: dict[tuple[torch.device, int], torch.Tensor] = {}


def tickets(device: torch.device, n: int) -> torch.Tensor:
    """The merge's per-KV-head tickets on a device: zeros, which every call leaves at zero, so the layers of
    a step (run one after another) and every replay of a captured step share one buffer. Made on first use,
    which is an eager step before any capture."""
    key = (device, n)
    if key not in _TICKETS:
        _TICKETS[key] = torch.zeros(n, dtype=torch.int32, device=device)
    return _TICKETS[key]
