"""The reference path: plain PyTorch, one function per fusion boundary of the decode step.

Legend: S seq (tokens in this call), Smax cache length, H heads, KVH kv heads, D head_dim, C dim,
F hidden, V vocab. Each fused Triton kernel has the same signature and is tested against these.
Norms are computed in fp32 and matmuls accumulate in fp32 (cuBLAS does for bf16/fp16).
Linear weights come as config.Weight values; FP8 ones (int8 bit patterns, E4M3 with a per-row scale; the
value's fmt says which) are dequantized to the activation dtype first.
Bytes are for one decode step (S=1) at Llama-2-7B in bf16.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from llamafast.config import SparseMode, Weight
from llamafast.quant import dequantize, int8_blocks
from llamafast.sampling import sample


def dense(w: Weight, dtype: torch.dtype) -> torch.Tensor:
    """w's values in dtype (N, K), its tail's rows included."""
    out = dequantize(w.data, w.scale, dtype, w.fmt).to(dtype)
    return out if w.tail is None else torch.cat([out, dense(w.tail, dtype)])


def product(x: torch.Tensor, w: Weight) -> torch.Tensor:
    """x @ w.T in x's dtype. One token against a weight that takes int8 activations (Weight.int8_activations: the
    triton backend's, never this backend's own) multiplies x rounded to int8 per block of 32, in fp32, as the
    decode kernels do: their tests' oracle."""
    if x.shape[0] == 1 and w.int8_activations:
        return (int8_blocks(x) @ dense(w, torch.float32).T).to(x.dtype)
    return x @ dense(w, x.dtype).T


def normed_products(x: torch.Tensor, norm_w: torch.Tensor, eps: float, *ws: Weight) -> list[torch.Tensor]:
    """rmsnorm(x) @ w.T for each w, the norm (or the int8 blocks) computed once. With int8 activations (the first
    weight's choice, as the kernels make it), the blocks are of x * norm_w and the norm's scale multiplies the
    products, as the kernels apply it (the same numbers up to rounding)."""
    if x.shape[0] == 1 and ws[0].int8_activations:
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        blocks = int8_blocks(xf * norm_w.float())
        return [((blocks @ dense(w, torch.float32).T) * rstd).to(x.dtype) for w in ws]
    h = rmsnorm(x, norm_w, eps)
    return [h @ dense(w, x.dtype).T for w in ws]


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotates Meta's interleaved (even, odd) pairs. x (S, H, D); cos, sin (S, D/2) fp32."""
    xf = x.float().unflatten(-1, (-1, 2))  # (S, H, D/2, 2)
    a, b = xf[..., 0], xf[..., 1]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2).to(x.dtype)


def rmsnorm_qkv_rope(x, norm_w, wqkv: Weight, cos, sin, pos, k_cache, v_cache, eps):
    """q = rope(norm(x) @ wq.T); k, v likewise (no rope on v) are written into the caches at pos.

    x (S, C); norm_w (C,); wqkv (H*D + 2*KVH*D, C); cos, sin (Smax, D/2) fp32 tables;
    pos () int64 device tensor, the position of x[0]; k_cache, v_cache (KVH, Smax, D), written in place.
    Returns q (S, H, D). Reads 50 MB of wqkv at 7B, writes 2 x 8 KB of cache.
    """
    S = x.shape[0]
    KVH, _, D = k_cache.shape
    positions = pos + torch.arange(S, device=x.device)  # (S,)
    (qkv,) = normed_products(x, norm_w, eps, wqkv)  # (S, H*D + 2*KVH*D)
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


def linear_residual(x, w: Weight, residual):
    """residual + x @ w.T: the output projection (wo, 32 MB) and down projection (w2, 90 MB) at 7B."""
    return residual + product(x, w)


def rmsnorm_swiglu(x, norm_w, w1: Weight, w3: Weight, eps):
    """silu(norm(x) @ w1.T) * (norm(x) @ w3.T). x (S, C); w1, w3 (F, C) -> (S, F). Reads 180 MB at 7B."""
    gate, up = normed_products(x, norm_w, eps, w1, w3)
    return F.silu(gate) * up


def rmsnorm_lm_head(x, norm_w, w: Weight, eps):
    """Final norm and LM head: logits (S, V) in fp32. w (V, C): 262 MB at 7B."""
    (logits,) = normed_products(x, norm_w, eps, w)
    return logits.float()


# The sparse FFN (llamafast/sparse/ builds its parts). Groups of G neurons are contiguous rows of w1 and w3
# and of w2t, the down projection stored transposed (F, C); its E4M3 scales are per output column (C,), the
# same numbers as w2's per-row scales. work is the kernels' int32 scratch (config.sparse_work_size); the
# reference fills the same counters.

def linear_residual_t(x, w2t: Weight, residual):
    """residual + x @ w2t for a transposed weight (F, C): the dense down projection of a sparsified model."""
    return residual + x @ dense_t(w2t, x.dtype)


def dense_t(w2t: Weight, dtype: torch.dtype) -> torch.Tensor:
    """A transposed weight's values (F, C): its E4M3 scales are per column, its Q8_0 blocks run along C."""
    if w2t.fmt.is_block:
        return dense(w2t, dtype)
    return dequantize(w2t.data.t(), w2t.scale, dtype, w2t.fmt).t().to(dtype)


def select_groups(h, gate, router_w, router_b, threshold, group_size, mode):
    """(active groups (S, n) bool, SiLU(gate) (S, F) or None) for the normed input h (S, C) in the model dtype
    and its gate products h @ w1.T. router: sigmoid(h @ router_w.T + router_b) > threshold. gate: sum over the
    group of |SiLU(gate)| > threshold."""
    if mode == SparseMode.router:
        scores = torch.sigmoid((h @ router_w.T).float() + router_b)
        return scores > threshold, None
    act = F.silu(gate)
    mass = act.float().abs().unflatten(-1, (-1, group_size)).sum(-1)
    return mass > threshold, act


def sparse_ffn(x, norm_w, w1: Weight, w3: Weight, w2t: Weight, router_w, router_b, threshold, work, eps, group_size,
               mode):
    """x + the FFN of norm(x) over the active groups only: x (S, C) -> (S, C), summed in fp32. Gate and up are
    normed_products' (int8 activations where the weights take them); the down projection multiplies float h."""
    dtype = x.dtype
    h = rmsnorm(x, norm_w, eps)
    gate, up = normed_products(x, norm_w, eps, w1, w3)
    active, _ = select_groups(h, gate, router_w, router_b, threshold, group_size, mode)
    keep = active.repeat_interleave(group_size, dim=-1)
    f = F.silu(gate) * up * keep
    _count(work, active)
    return (x.float() + (f @ dense_t(w2t, dtype)).float()).to(x.dtype)


def _count(work, active):
    """The kernels' counters: count and ids of the last row's active groups; calls and groups run, summed."""
    n = active.shape[-1]
    last = active[-1]
    work[0] = last.sum()
    work[2] += active.shape[0]
    work[3] += active.sum()
    work[4 : 4 + n] = torch.argsort((~last).to(torch.uint8), stable=True)  # active ids first, ascending
    work[4 + n : 4 + 2 * n] = last


def sample_token(logits, seen, counts, draw, cfg, n_vocab=None):
    """The next token (1,) from logits (V,): llamafast.sampling.sample, its noise from torch's generator (draw, the
    fused kernel's seed and counter, is left alone)."""
    return sample(logits, seen, cfg, n_vocab, counts)


def advance_state(nxt, token, seen, counts, pos, ring, x, table, n, counted):
    """kernels/advance_state.py in torch: token, seen, counts (when counted) and pos take the sampled token nxt,
    the ring's slot of the new position holds it (the ring on the state's device), and x its row of table."""
    x.copy_(table[nxt])
    token.copy_(nxt)
    seen.index_fill_(0, token, True)
    if counted:
        counts.index_add_(0, token, torch.ones_like(counts[:1]))
    pos.add_(n)
    ring.index_copy_(0, pos.view(1) % ring.numel(), token)
