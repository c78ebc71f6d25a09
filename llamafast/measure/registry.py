"""REGISTRY: each decode-step kernel with its torch reference, inputs at a model shape, and bytes moved.

Tests and `llamafast bench --kernels` both take their inputs from here, so the benchmark times exactly
what the tests check. Inputs are random (never zeros) and the position is the last of `context` tokens.
With fp8 set, the weights are quantized (llamafast.quant) into config.Weight values with their scales; the
reference then dequantizes the very same weights.
Legend: C dim, N rows, H heads, KVH kv heads, D head_dim, F hidden, V vocab, L context.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from llamafast import reference
from llamafast.config import (
    ModelConfig, SamplingConfig, SparseLayout, SparseMode, Weight, WeightFormat, default_group_size, sparse_work_size,
)
from llamafast.model import rope_tables
from llamafast.quant import FP8Format, quantize, quantize_blocks

from llamafast.kernels import (
    advance_state, decode_attention, linear_residual, rmsnorm_lm_head, rmsnorm_qkv_rope, rmsnorm_swiglu, sample_token,
    sparse_ffn,
)

Inputs = tuple[tuple, dict]  # positional arguments, keyword arguments


@dataclass(frozen=True)
class KernelSpec:
    name: str
    kernel: Callable
    reference: Callable
    # (config, dtype, device, context L, fp8 format or None) -> (args, kwargs)
    make_inputs: Callable[[ModelConfig, torch.dtype, torch.device, int, FP8Format | None], Inputs]
    # (config, dtype, context, fp8) -> the fewest bytes one call must read and write
    bytes_moved: Callable[[ModelConfig, torch.dtype, int, FP8Format | None], int]


def rand(*shape, dtype, device, scale=1.0):
    return (torch.randn(shape, device=device, dtype=torch.float32) * scale).to(dtype)


def weight(n, k, dtype, device, fp8: FP8Format | WeightFormat | None) -> Weight:
    """A random (n, k) weight: float, FP8 bit patterns in int8 (E4M3 with its row scales), or a block format
    (WeightFormat.q8_0, q4_0, q4_1, the K-quants) with its block scales, its products' activations int8 where the
    format allows, as the triton backend runs them (Weight.int8)."""
    w = rand(n, k, dtype=dtype, device=device, scale=k**-0.5)
    if fp8 is None:
        return Weight(w)
    if isinstance(fp8, WeightFormat):
        return Weight(*quantize_blocks(w, fp8), fp8, int8=True)
    q, scale, _ = quantize(w, fp8)
    return Weight(q, scale, fp8.format)


def norm_inputs(c: ModelConfig, dtype, device, rows: int = 1):
    return rand(rows, c.dim, dtype=dtype, device=device), rand(c.dim, dtype=dtype, device=device, scale=0.2) + 1


def cache(c: ModelConfig, dtype, device, context: int):
    return rand(c.n_kv_heads, context, c.head_dim, dtype=dtype, device=device)


def _qkv_inputs(c: ModelConfig, dtype, device, context, fp8=None):
    cos, sin = rope_tables(c.head_dim, context, c.rope_theta, device, c.rope_scaling, c.rope_freq_factors)
    pos = torch.tensor(context - 1, device=device)
    w = weight(c.qkv_dim, c.dim, dtype, device, fp8)
    caches = cache(c, dtype, device, context), cache(c, dtype, device, context)
    return (*norm_inputs(c, dtype, device), w, cos, sin, pos, *caches, c.norm_eps), {}


def _attention_inputs(c: ModelConfig, dtype, device, context, fp8=None, length: int | None = None):
    """A cache of context positions, the first length of them in use (default: all)."""
    q = rand(1, c.n_heads, c.head_dim, dtype=dtype, device=device)
    pos = torch.tensor((length or context) - 1, device=device)
    return (q, cache(c, dtype, device, context), cache(c, dtype, device, context), pos), {}


# The builders below also serve the prefill registry, at `rows` tokens (the context does not enter them).
def residual_inputs(n_in: Callable[[ModelConfig], int]):
    def make(c: ModelConfig, dtype, device, context, fp8=None, rows: int = 1):
        k = n_in(c)
        x, res = rand(rows, k, dtype=dtype, device=device), rand(rows, c.dim, dtype=dtype, device=device)
        return (x, weight(c.dim, k, dtype, device, fp8), res), {}

    return make


def swiglu_inputs(c: ModelConfig, dtype, device, context, fp8=None, rows: int = 1):
    w1, w3 = (weight(c.hidden_dim, c.dim, dtype, device, fp8) for _ in range(2))
    return (*norm_inputs(c, dtype, device, rows), w1, w3, c.norm_eps), {}


def lm_head_inputs(c: ModelConfig, dtype, device, context, fp8=None, rows: int = 1):
    w = weight(c.vocab_size, c.dim, dtype, device, fp8)
    return (*norm_inputs(c, dtype, device, rows), w, c.norm_eps), {}


# The sparse FFN at half of its groups skipped, groups of config.default_group_size: router mode with
# exact_parts' router (every call runs exactly n/2 groups), gate mode with the threshold midway between the two
# middle group masses of this x.
SPARSE_SKIP = 0.5


def sparse_inputs(mode: SparseMode):
    def make(c: ModelConfig, dtype, device, context, fp8=None):
        from llamafast.sparse import exact_parts

        (x, norm_w), f, g = norm_inputs(c, dtype, device), c.hidden_dim, default_group_size(c.hidden_dim)
        n = f // g
        w1, w3 = (weight(f, c.dim, dtype, device, fp8) for _ in range(2))
        w2t = transposed(rand(c.dim, f, dtype=dtype, device=device, scale=f**-0.5), fp8)
        layout = SparseLayout(g, (0.0, SPARSE_SKIP))
        w1f = reference.dense(w1, torch.float32)
        parts = exact_parts(c, layout, dtype, device, torch.Generator(device=device).manual_seed(0), w1f, norm_w)
        thr = parts["thresholds"][0, 1:].clone()
        if mode == SparseMode.gate:
            h = reference.rmsnorm(x.float(), norm_w.float(), c.norm_eps)
            mass = torch.nn.functional.silu(h @ w1f.T)[0].abs().unflatten(0, (n, g)).sum(-1).sort().values
            thr = ((mass[n // 2 - 1] + mass[n // 2]) / 2).reshape(1)
        work = torch.zeros(sparse_work_size(n), dtype=torch.int32, device=device)
        args = (x, norm_w, w1, w3, w2t, parts["router.weight"], parts["router_bias"], thr, work, c.norm_eps, g, mode)
        return args, {}

    return make


def transposed(w2, fp8: FP8Format | WeightFormat | None) -> Weight:
    """The sparse FFN's W2t (F, C) of w2 (C, F), as sparsify writes it: float, FP8 (E4M3's scales per output
    channel: per column of W2t), or for block weights Q8_0 along C (llamafast/sparse/blocks.py)."""
    if fp8 is None:
        return Weight(w2.t().contiguous())
    if isinstance(fp8, WeightFormat):
        from llamafast.sparse.blocks import W2T_BLOCKS, transposed_blocks

        return Weight(*transposed_blocks(w2.float()), W2T_BLOCKS)
    q, scale, _ = quantize(w2, fp8)
    return Weight(q.t().contiguous(), scale, fp8.format)


def _sparse_bytes(mode: SparseMode):
    """What the sparse FFN must read at SPARSE_SKIP: the router (router mode) or all of W1 (gate mode), then the
    running groups' rows of W1 and W3 (router mode) or W3 alone, and of W2t; x, and the fp32 output. Block weights
    count whole blocks with their scales, W2t's in Q8_0 (llamafast/sparse/blocks.py)."""
    def count(c: ModelConfig, dtype, context, fp8=None):
        s, f, g = dtype.itemsize, c.hidden_dim, default_group_size(c.hidden_dim)
        n = f // g
        rows = (n - round(n * SPARSE_SKIP)) * g

        def stored(fmt, r: int) -> int:  # r rows of C weights
            return fmt.stored_bytes(r, c.dim) if isinstance(fmt, WeightFormat) else r * c.dim * (1 if fmt else s)

        w2t = WeightFormat.q8_0 if isinstance(fp8, WeightFormat) else fp8
        if mode == SparseMode.router:
            select, gate_up = n * c.dim * s + 4 * n, 2 * stored(fp8, rows)
        else:
            select, gate_up = stored(fp8, f), stored(fp8, rows)
        return select + gate_up + stored(w2t, rows) + c.dim * s + 4 * c.dim

    return count


def _gemv_bytes(n: Callable[[ModelConfig], int], k: Callable[[ModelConfig], int], out_bytes: int = 0):
    def count(c: ModelConfig, dtype, context, fp8=None):
        s = dtype.itemsize
        if isinstance(fp8, WeightFormat):  # whole blocks, scales included
            weights = fp8.stored_bytes(n(c), k(c))
        else:
            weights = n(c) * k(c) * (1 if fp8 else s) + (4 * n(c) if fp8 == FP8Format.e4m3 else 0)
        return weights + k(c) * s + n(c) * (out_bytes or s)

    return count


def _attention_bytes(c: ModelConfig, dtype, context, fp8=None):
    return 2 * c.kv_dim * context * dtype.itemsize + 2 * c.dim * dtype.itemsize


def _sample_inputs(c: ModelConfig, dtype, device, context, fp8=None):
    """The LM head's fp32 logits, a tenth of the vocabulary seen, and the default way of sampling."""
    logits = rand(c.vocab_size, dtype=torch.float32, device=device, scale=3.0)
    seen = torch.arange(c.vocab_size, device=device) % 10 == 0
    counts = torch.zeros(c.vocab_size, dtype=torch.int32, device=device)
    draw = torch.tensor([1, 0], device=device)
    return (logits, seen, counts, draw, SamplingConfig()), {}


def _advance_inputs(c: ModelConfig, dtype, device, context, fp8=None):
    """A sampled token, the engine's state at the last of context positions, a ring on the device, counts kept,
    the embedding table whose row the next step starts from."""
    nxt = torch.randint(c.vocab_size, (1,), device=device)
    token = torch.zeros(1, dtype=torch.int64, device=device)
    seen = torch.arange(c.vocab_size, device=device) % 10 == 0
    counts = torch.zeros(c.vocab_size, dtype=torch.int32, device=device)
    pos = torch.tensor(context - 1, device=device)
    ring = torch.zeros(4, dtype=torch.int64, device=device)
    table = torch.randn(c.vocab_size, c.dim, dtype=dtype, device=device)
    x = torch.empty(1, c.dim, dtype=dtype, device=device)
    return (nxt, token, seen, counts, pos, ring, x, table, 1, True), {}


def _advance_bytes(c: ModelConfig, dtype, context, fp8=None):
    """The sampled token and the position read, token, position and ring slot written (8 bytes each), one seen
    flag written, one count read and written, one embedding row read and written."""
    return 8 + 8 + 2 * 8 + 8 + 1 + 2 * 4 + 2 * c.dim * dtype.itemsize


REGISTRY: dict[str, KernelSpec] = {
    spec.name: spec
    for spec in [
        KernelSpec("rmsnorm_qkv_rope", rmsnorm_qkv_rope, reference.rmsnorm_qkv_rope, _qkv_inputs,
                   _gemv_bytes(lambda c: c.qkv_dim, lambda c: c.dim)),
        KernelSpec("decode_attention", decode_attention, reference.attention, _attention_inputs, _attention_bytes),
        KernelSpec("linear_residual[wo]", linear_residual, reference.linear_residual,
                   residual_inputs(lambda c: c.dim), _gemv_bytes(lambda c: c.dim, lambda c: c.dim)),
        KernelSpec("rmsnorm_swiglu", rmsnorm_swiglu, reference.rmsnorm_swiglu, swiglu_inputs,
                   _gemv_bytes(lambda c: 2 * c.hidden_dim, lambda c: c.dim)),
        KernelSpec("linear_residual[w2]", linear_residual, reference.linear_residual,
                   residual_inputs(lambda c: c.hidden_dim), _gemv_bytes(lambda c: c.dim, lambda c: c.hidden_dim)),
        KernelSpec("rmsnorm_lm_head", rmsnorm_lm_head, reference.rmsnorm_lm_head, lm_head_inputs,
                   _gemv_bytes(lambda c: c.vocab_size, lambda c: c.dim, out_bytes=4)),
        KernelSpec("sample_token[T 0.6 top-p 0.9]", sample_token, reference.sample_token, _sample_inputs,
                   lambda c, dtype, context, fp8=None: 4 * c.vocab_size),
        KernelSpec("advance_state", advance_state, reference.advance_state, _advance_inputs, _advance_bytes),
        *[KernelSpec(f"sparse_ffn[{m.value} {SPARSE_SKIP:g}]", sparse_ffn, reference.sparse_ffn, sparse_inputs(m),
                     _sparse_bytes(m)) for m in SparseMode],
    ]
}
