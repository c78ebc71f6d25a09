"""The reference path: plain PyTorch, one function per fusion boundary of the decode step.

Legend: S seq (tokens in this call), Smax cache length, H heads, KVH kv heads, D head_dim, C dim,
F hidden, V vocab. Each fused Triton kernel has the same signature and is tested against these.
Norms are computed in fp32 and matmuls accumulate in fp32 (cuBLAS does for bf16/fp16).
FP8 weights (int8 bit patterns, E4M3 with a per-row scale; fmt says which) are dequantized to the activation
dtype first.
Bytes are for one decode step (S=1) at Llama-2-7B in bf16.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from llamafast.config import WeightFormat
from llamafast.quant import dequantize

FLOAT = WeightFormat.float


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotates Meta's interleaved (even, odd) pairs. x (S, H, D); cos, sin (S, D/2) fp32."""
    xf = x.float().unflatten(-1, (-1, 2))  # (S, H, D/2, 2)
    a, b = xf[..., 0], xf[..., 1]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2).to(x.dtype)


def rmsnorm_qkv_rope(x, norm_w, wqkv, cos, sin, pos, k_cache, v_cache, eps, wqkv_scale=None, fmt=FLOAT):
    """q = rope(norm(x) @ wq.T); k, v likewise (no rope on v) are written into the caches at pos.

    x (S, C); norm_w (C,); wqkv (H*D + 2*KVH*D, C); cos, sin (Smax, D/2) fp32 tables;
    pos () int64 device tensor, the position of x[0]; k_cache, v_cache (KVH, Smax, D), written in place.
    Returns q (S, H, D). Reads 50 MB of wqkv at 7B, writes 2 x 8 KB of cache.
    """
    S = x.shape[0]
    KVH, _, D = k_cache.shape
    positions = pos + torch.arange(S, device=x.device)  # (S,)
    qkv = rmsnorm(x, norm_w, eps) @ dequantize(wqkv, wqkv_scale, x.dtype, fmt).T  # (S, H*D + 2*KVH*D)
    q, k, v = qkv.split([qkv.shape[1] - 2 * KVH * D, KVH * D, KVH * D], dim=1)
    c, s = cos[positions], sin[positions]  # (S, D/2)
    q = rope(q.unflatten(1, (-1, D)), c, s)  # (S, H, D)
    k = rope(k.unflatten(1, (KVH, D)), c, s)  # (S, KVH, D)
    k_cache.index_copy_(1, positions, k.transpose(0, 1).to(k_cache.dtype))
    v_cache.index_copy_(1, positions, v.unflatten(1, (KVH, D)).transpose(0, 1).to(v_cache.dtype))
    return q


def attention(q, k_cache, v_cache, pos):
    """Causal attention of q (S, H, D) at positions pos.. over the cache (KVH, Smax, D) -> (S, H*D).

    Masks the whole cache rather than slicing it to the current length, so the shapes stay static
    and the step can be captured in a CUDA graph; it reads Smax positions, not only the valid ones.
    """
    S, H, D = q.shape
    KVH, Smax, _ = k_cache.shape
    positions = pos + torch.arange(S, device=q.device)
    mask = torch.arange(Smax, device=q.device)[None, :] <= positions[:, None]  # (S, Smax)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k_cache[None], v_cache[None], attn_mask=mask, enable_gqa=H != KVH
    )  # (1, H, S, D)
    return out[0].transpose(0, 1).reshape(S, H * D)


def linear_residual(x, w, residual, w_scale=None, fmt=FLOAT):
    """residual + x @ w.T: the output projection (wo, 32 MB) and down projection (w2, 90 MB) at 7B."""
    return residual + x @ dequantize(w, w_scale, x.dtype, fmt).T


def rmsnorm_swiglu(x, norm_w, w1, w3, eps, w1_scale=None, w3_scale=None, fmt=FLOAT):
    """silu(norm(x) @ w1.T) * (norm(x) @ w3.T). x (S, C); w1, w3 (F, C) -> (S, F). Reads 180 MB at 7B."""
    h = rmsnorm(x, norm_w, eps)
    return F.silu(h @ dequantize(w1, w1_scale, x.dtype, fmt).T) * (h @ dequantize(w3, w3_scale, x.dtype, fmt).T)


def rmsnorm_lm_head(x, norm_w, w, eps, w_scale=None, fmt=FLOAT):
    """Final norm and LM head: logits (S, V) in fp32. w (V, C): 262 MB at 7B."""
    return (rmsnorm(x, norm_w, eps) @ dequantize(w, w_scale, x.dtype, fmt).T).float()
