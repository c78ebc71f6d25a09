"""PREFILL: each prompt kernel with its torch reference, inputs for M tokens at position pos, and FLOPs.

Tests and scripts/bench_prefill_kernels.py take their inputs from here. The cache holds pos + M positions
(rounded up to 64), so the chunk attends to pos earlier positions. Legend as in registry.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from llamafast import reference
from llamafast.config import ModelConfig
from llamafast.model import rope_tables
from llamafast.quant import FP8Format

from .flash_attention import flash_attention
from .prefill_linear import prefill_linear_residual, prefill_lm_head
from .prefill_qkv_rope import prefill_qkv_rope
from .prefill_swiglu import prefill_swiglu
from .registry import Inputs, rand, weight


@dataclass(frozen=True)
class PrefillSpec:
    name: str
    kernel: Callable
    reference: Callable
    # (config, dtype, device, M tokens, pos, fp8 format or None) -> (args, kwargs)
    make_inputs: Callable[[ModelConfig, torch.dtype, torch.device, int, int, FP8Format | None], Inputs]
    # (config, M, pos) -> floating-point operations of one call
    flops: Callable[[ModelConfig, int, int], float]


def _cache_len(m: int, pos: int) -> int:
    return -(-(m + pos) // 64) * 64


def _x(c: ModelConfig, m: int, dtype, device):
    return rand(m, c.dim, dtype=dtype, device=device), rand(c.dim, dtype=dtype, device=device, scale=0.2) + 1


def _qkv_inputs(c: ModelConfig, dtype, device, m, pos, fp8=None):
    smax = _cache_len(m, pos)
    cos, sin = rope_tables(c.head_dim, smax, c.rope_theta, device)
    w, s = weight(c.qkv_dim, c.dim, dtype, device, fp8)
    caches = [rand(c.n_kv_heads, smax, c.head_dim, dtype=dtype, device=device) for _ in range(2)]
    position = torch.tensor(pos, device=device)
    return (*_x(c, m, dtype, device), w, cos, sin, position, *caches, c.norm_eps), {"wqkv_scale": s}


def _attention_inputs(c: ModelConfig, dtype, device, m, pos, fp8=None):
    smax = _cache_len(m, pos)
    q = rand(m, c.n_heads, c.head_dim, dtype=dtype, device=device)
    caches = [rand(c.n_kv_heads, smax, c.head_dim, dtype=dtype, device=device) for _ in range(2)]
    return (q, *caches, torch.tensor(pos, device=device)), {}


def _residual_inputs(n_in: Callable[[ModelConfig], int]):
    def make(c: ModelConfig, dtype, device, m, pos, fp8=None):
        x, res = rand(m, n_in(c), dtype=dtype, device=device), rand(m, c.dim, dtype=dtype, device=device)
        w, s = weight(c.dim, n_in(c), dtype, device, fp8)
        return (x, w, res), {"w_scale": s}

    return make


def _swiglu_inputs(c: ModelConfig, dtype, device, m, pos, fp8=None):
    (w1, s1), (w3, s3) = (weight(c.hidden_dim, c.dim, dtype, device, fp8) for _ in range(2))
    return (*_x(c, m, dtype, device), w1, w3, c.norm_eps), {"w1_scale": s1, "w3_scale": s3}


def _lm_head_inputs(c: ModelConfig, dtype, device, m, pos, fp8=None):
    w, s = weight(c.vocab_size, c.dim, dtype, device, fp8)
    return (*_x(c, m, dtype, device), w, c.norm_eps), {"w_scale": s}


def _matmul_flops(n: Callable[[ModelConfig], int], k: Callable[[ModelConfig], int]):
    return lambda c, m, pos: 2.0 * m * n(c) * k(c)


def attention_flops(c: ModelConfig, m: int, pos: int) -> float:
    """QK^T and PV over the visible keys only (pos + i + 1 for query i): 4 D per query-key pair and head."""
    pairs = m * pos + m * (m + 1) / 2
    return 4.0 * c.head_dim * c.n_heads * pairs


PREFILL: dict[str, PrefillSpec] = {
    spec.name: spec
    for spec in [
        PrefillSpec("prefill_qkv_rope", prefill_qkv_rope, reference.rmsnorm_qkv_rope, _qkv_inputs,
                    _matmul_flops(lambda c: c.qkv_dim, lambda c: c.dim)),
        PrefillSpec("flash_attention", flash_attention, reference.attention, _attention_inputs, attention_flops),
        PrefillSpec("prefill_linear_residual[wo]", prefill_linear_residual, reference.linear_residual,
                    _residual_inputs(lambda c: c.dim), _matmul_flops(lambda c: c.dim, lambda c: c.dim)),
        PrefillSpec("prefill_swiglu", prefill_swiglu, reference.rmsnorm_swiglu, _swiglu_inputs,
                    _matmul_flops(lambda c: 2 * c.hidden_dim, lambda c: c.dim)),
        PrefillSpec("prefill_linear_residual[w2]", prefill_linear_residual, reference.linear_residual,
                    _residual_inputs(lambda c: c.hidden_dim), _matmul_flops(lambda c: c.dim, lambda c: c.hidden_dim)),
        PrefillSpec("prefill_lm_head", prefill_lm_head, reference.rmsnorm_lm_head, _lm_head_inputs,
                    _matmul_flops(lambda c: c.vocab_size, lambda c: c.dim)),
    ]
}
