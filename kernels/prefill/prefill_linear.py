"""The prompt's remaining matmuls on tensor cores: the output and down projections with their residual add,
and the final RMSNorm + LM head when every position's logits are wanted.

    linear_residual: out = residual + x @ W.T          lm_head: logits = rmsnorm(x) @ W.T in fp32

Both run tiles.matmul (the residual add is a constexpr epilogue); the LM head's norm is the rmsnorm_rows pre-pass.
Legend: M tokens, K in, N out. Llama-2-7B, M = 512: wo 17.2 GFLOP (34 MB in bf16), w2 46.2 GFLOP (90 MB).
"""

from __future__ import annotations

import torch

from llamafast.config import Weight

from .._common import check_rows, check_vector
from .rmsnorm_rows import rmsnorm_rows
from .tiles import TileConfig, matmul

# Row count bound -> launch, shared by wo and w2 (`scripts/tune.py prefill`). H100, 7B bf16: wo 35.0 / 194.8 us and
# w2 76.9 / 509.2 us at 512 / 4,000 tokens (scripts/results/prefill_kernels_7b.txt, the run of record).
CONFIGS: dict[int, TileConfig] = {
    256: TileConfig(64, 64, 64, 4, 4),
    1024: TileConfig(128, 128, 64, 8, 4),
    4096: TileConfig(128, 256, 64, 8, 3),
}


def prefill_linear_residual(x, w: Weight, residual, configs=None, out=None):
    """Same contract as llamafast.reference.linear_residual: x (M, K), residual (M, N) -> (M, N). Tensor
    parallelism's partial sums (tp/comm.py) take two more forms: residual None, x @ W.T alone; out, written in
    place of a new tensor (a symmetric-memory buffer the ranks sum from)."""
    (m, k), n = x.shape, w.shape[0]
    check_rows("x", x, k)
    check_rows("w", w.data, k)
    for name, t in (("residual", residual), ("out", out)):
        assert t is None or (t.shape == (m, n) and t.is_contiguous() and t.dtype == x.dtype), f"{name}: (M, N) contiguous"
    out = torch.empty((m, n), device=x.device, dtype=x.dtype) if out is None else out
    matmul(x, w, residual, out, configs or CONFIGS)
    return out


def prefill_lm_head(x, norm_w, w: Weight, eps, configs=None):
    """Same contract as llamafast.reference.rmsnorm_lm_head: x (M, C) -> logits (M, V) in fp32."""
    m, c = x.shape
    check_rows("x", x, c)
    check_vector("norm_w", norm_w, c)
    check_rows("w", w.data, c)
    out = torch.empty((m, w.shape[0]), device=x.device, dtype=torch.float32)
    matmul(rmsnorm_rows(x, norm_w, eps), w, None, out, configs or CONFIGS)
    return out
