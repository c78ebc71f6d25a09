"""PREFILL: each prompt kernel with its torch reference, inputs for M tokens at position pos, and FLOPs.

Tests and `llamafast bench --kernels --prefill` take their inputs from here. The cache holds pos + M positions
(rounded up to 64), so the chunk attends to pos earlier positions. Legend as in registry.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from llamafast import reference
from llamafast.bench.prefill import attention_flops
from llamafast.config import ModelConfig
from llamafast.model import rope_tables
from llamafast.quant import FP8Format

from llamafast.measure.registry import (
    Inputs, cache, lm_head_inputs, norm_inputs, rand, residual_inputs, swiglu_inputs, weight,
)
from llamafast.kernels import flash_attention, prefill_linear_residual, prefill_lm_head, prefill_qkv_rope, prefill_swiglu


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


def _qkv_inputs(c: ModelConfig, dtype, device, m, pos, fp8=None):
    smax = _cache_len(m, pos)
    cos, sin = rope_tables(c.head_dim, smax, c.rope_theta, device, c.rope_scaling, c.rope_freq_factors)
    w = weight(c.qkv_dim, c.dim, dtype, device, fp8)
    caches = [cache(c, dtype, device, smax) for _ in range(2)]
    position = torch.tensor(pos, device=device)
    return (*norm_inputs(c, dtype, device, m), w, cos, sin, position, *caches, c.norm_eps), {}


def _attention_inputs(c: ModelConfig, dtype, device, m, pos, fp8=None):
    smax = _cache_len(m, pos)
    q = rand(m, c.n_heads, c.head_dim, dtype=dtype, device=device)
    caches = [cache(c, dtype, device, smax) for _ in range(2)]
    return (q, *caches, torch.tensor(pos, device=device)), {}


def _rows(make: Callable):
    """A decode registry builder (registry.py) at M rows; the position does not enter these ops."""
    return lambda c, dtype, device, m, pos, fp8=None: make(c, dtype, device, m + pos, fp8, rows=m)


def _matmul_flops(n: Callable[[ModelConfig], int], k: Callable[[ModelConfig], int]):
    return lambda c, m, pos: 2.0 * m * n(c) * k(c)


PREFILL: dict[str, PrefillSpec] = {
    spec.name: spec
    for spec in [
        PrefillSpec("prefill_qkv_rope", prefill_qkv_rope, reference.rmsnorm_qkv_rope, _qkv_inputs,
                    _matmul_flops(lambda c: c.qkv_dim, lambda c: c.dim)),
        PrefillSpec("flash_attention", flash_attention, reference.attention, _attention_inputs, attention_flops),
        PrefillSpec("prefill_linear_residual[wo]", prefill_linear_residual, reference.linear_residual,
                    _rows(residual_inputs(lambda c: c.dim)), _matmul_flops(lambda c: c.dim, lambda c: c.dim)),
        PrefillSpec("prefill_swiglu", prefill_swiglu, reference.rmsnorm_swiglu, _rows(swiglu_inputs),
                    _matmul_flops(lambda c: 2 * c.hidden_dim, lambda c: c.dim)),
        PrefillSpec("prefill_linear_residual[w2]", prefill_linear_residual, reference.linear_residual,
                    _rows(residual_inputs(lambda c: c.hidden_dim)),
                    _matmul_flops(lambda c: c.dim, lambda c: c.hidden_dim)),
        PrefillSpec("prefill_lm_head", prefill_lm_head, reference.rmsnorm_lm_head, _rows(lm_head_inputs),
                    _matmul_flops(lambda c: c.vocab_size, lambda c: c.dim)),
    ]
}
