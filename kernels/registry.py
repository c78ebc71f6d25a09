"""REGISTRY: each decode-step kernel with its torch reference, inputs at a model shape, and bytes moved.

Tests and `llamafast bench --kernels` both take their inputs from here, so the benchmark times exactly
what the tests check. Inputs are random (never zeros) and the position is the last of `context` tokens.
Legend: C dim, N rows, H heads, KVH kv heads, D head_dim, F hidden, V vocab, L context.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from llamafast import reference
from llamafast.config import ModelConfig
from llamafast.model import rope_tables

from .decode_attention import decode_attention
from .linear_residual import linear_residual
from .rmsnorm_lm_head import rmsnorm_lm_head
from .rmsnorm_qkv_rope import rmsnorm_qkv_rope
from .rmsnorm_swiglu import rmsnorm_swiglu


@dataclass(frozen=True)
class KernelSpec:
    name: str
    kernel: Callable
    reference: Callable
    make_inputs: Callable[[ModelConfig, torch.dtype, torch.device, int], tuple]  # (config, dtype, device, L)
    bytes_moved: Callable[[ModelConfig, torch.dtype, int], int]  # fewest bytes one call must read and write


def _rand(*shape, dtype, device, scale=1.0):
    return (torch.randn(shape, device=device, dtype=torch.float32) * scale).to(dtype)


def _weight(n, k, dtype, device):
    return _rand(n, k, dtype=dtype, device=device, scale=k**-0.5)


def _cache(c: ModelConfig, dtype, device, context: int):
    return _rand(c.n_kv_heads, context, c.head_dim, dtype=dtype, device=device)


def _qkv_inputs(c: ModelConfig, dtype, device, context):
    cos, sin = rope_tables(c.head_dim, context, c.rope_theta, device)
    pos = torch.tensor(context - 1, device=device)
    x, g = _rand(1, c.dim, dtype=dtype, device=device), _rand(c.dim, dtype=dtype, device=device, scale=0.2) + 1
    w = _weight(c.qkv_dim, c.dim, dtype, device)
    return x, g, w, cos, sin, pos, _cache(c, dtype, device, context), _cache(c, dtype, device, context), c.norm_eps


def _attention_inputs(c: ModelConfig, dtype, device, context):
    q = _rand(1, c.n_heads, c.head_dim, dtype=dtype, device=device)
    pos = torch.tensor(context - 1, device=device)
    return q, _cache(c, dtype, device, context), _cache(c, dtype, device, context), pos


def _residual_inputs(n_in: Callable[[ModelConfig], int]):
    def make(c: ModelConfig, dtype, device, context):
        k = n_in(c)
        x, res = _rand(1, k, dtype=dtype, device=device), _rand(1, c.dim, dtype=dtype, device=device)
        return x, _weight(c.dim, k, dtype, device), res

    return make


def _swiglu_inputs(c: ModelConfig, dtype, device, context):
    x, g = _rand(1, c.dim, dtype=dtype, device=device), _rand(c.dim, dtype=dtype, device=device, scale=0.2) + 1
    return x, g, _weight(c.hidden_dim, c.dim, dtype, device), _weight(c.hidden_dim, c.dim, dtype, device), c.norm_eps


def _lm_head_inputs(c: ModelConfig, dtype, device, context):
    x, g = _rand(1, c.dim, dtype=dtype, device=device), _rand(c.dim, dtype=dtype, device=device, scale=0.2) + 1
    return x, g, _weight(c.vocab_size, c.dim, dtype, device), c.norm_eps


def _gemv_bytes(n: Callable[[ModelConfig], int], k: Callable[[ModelConfig], int], out_bytes: int = 0):
    def count(c: ModelConfig, dtype, context):
        s = dtype.itemsize
        return n(c) * k(c) * s + k(c) * s + n(c) * (out_bytes or s)

    return count


def _attention_bytes(c: ModelConfig, dtype, context):
    return 2 * c.kv_dim * context * dtype.itemsize + 2 * c.dim * dtype.itemsize


REGISTRY: dict[str, KernelSpec] = {
    spec.name: spec
    for spec in [
        KernelSpec("rmsnorm_qkv_rope", rmsnorm_qkv_rope, reference.rmsnorm_qkv_rope, _qkv_inputs,
                   _gemv_bytes(lambda c: c.qkv_dim, lambda c: c.dim)),
        KernelSpec("decode_attention", decode_attention, reference.attention, _attention_inputs, _attention_bytes),
        KernelSpec("linear_residual[wo]", linear_residual, reference.linear_residual,
                   _residual_inputs(lambda c: c.dim), _gemv_bytes(lambda c: c.dim, lambda c: c.dim)),
        KernelSpec("rmsnorm_swiglu", rmsnorm_swiglu, reference.rmsnorm_swiglu, _swiglu_inputs,
                   _gemv_bytes(lambda c: 2 * c.hidden_dim, lambda c: c.dim)),
        KernelSpec("linear_residual[w2]", linear_residual, reference.linear_residual,
                   _residual_inputs(lambda c: c.hidden_dim), _gemv_bytes(lambda c: c.dim, lambda c: c.hidden_dim)),
        KernelSpec("rmsnorm_lm_head", rmsnorm_lm_head, reference.rmsnorm_lm_head, _lm_head_inputs,
                   _gemv_bytes(lambda c: c.vocab_size, lambda c: c.dim, out_bytes=4)),
    ]
}
