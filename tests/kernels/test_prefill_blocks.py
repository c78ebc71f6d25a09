"""The prefill matmuls on block-format weights (Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K), each tile dequantized in
registers (kernels/prefill/block_tiles.py), against the reference ops on the same blocks dequantized: fp32 and fp16
through the interpreter at odd shapes (N = 80 fills no BLOCK_N; M = 37 leaves a row tile partial; K = 160 in 64-wide
tiles and K = 768 in 512-wide ones leave the last K tile partial, EVEN_K False), bf16 at Llama-2-7B's on the GPU."""

from __future__ import annotations

import pytest
import torch
from llamafast.kernels import prefill_linear_residual, prefill_lm_head, prefill_qkv_rope, prefill_swiglu
from llamafast.kernels.prefill import prefill_swiglu as swiglu_module
from llamafast.kernels.prefill import tiles
from llamafast.kernels.prefill.tiles import TileConfig

from llamafast import reference
from llamafast.bench.prefill_registry import PREFILL
from llamafast.config import MODEL_CONFIGS, Weight, WeightFormat
from llamafast.measure.registry import rand
from llamafast.model import rope_tables
from llamafast.quant import quantize_blocks

from .common import BLOCKS, DEVICE, DOT_DTYPES, K_QUANTS
from .test_prefill import assert_matches, prefill_tolerance

N = 80  # output columns: no multiple of a BLOCK_N
HEADS, KV_HEADS, HEAD_DIM = 8, 1, 8  # qkv's N = (8 + 2 * 1) * 8 = 80
EPS = 1e-5

# (format, K, the launch: None for the interpreter's own, BLOCK_K = min(64, K rounded up to a power of two)).
# K = 160 runs two whole 64-wide tiles and one of a single block; BLOCK_K 32, the GPU's fp32 tiles, one block a
# tile; the K-quants' K = 256 fills 64-wide tiles, and K = 768 in 512-wide ones leaves the second half masked.
CASES = [
    *[pytest.param(fmt, 160, None, id=f"{fmt.value}-k160") for fmt in BLOCKS],
    *[pytest.param(fmt, 160, TileConfig(16, 32, 32, 4, 1), id=f"{fmt.value}-k160-bk32") for fmt in BLOCKS],
    *[pytest.param(fmt, 256, None, id=f"{fmt.value}-k256") for fmt in K_QUANTS],
    *[pytest.param(fmt, 768, TileConfig(16, 32, 512, 4, 1), id=f"{fmt.value}-k768-bk512") for fmt in K_QUANTS],
]


@pytest.fixture
def launch(monkeypatch):
    """Pins the prefill matmuls' launch (the interpreter's tile_config ignores the tables)."""
    def pin(cfg: TileConfig | None) -> None:
        if cfg is not None:
            for module in (tiles, swiglu_module):
                monkeypatch.setattr(module, "tile_config", lambda *args, **kwargs: cfg)

    return pin


def block_weight(n: int, k: int, fmt: WeightFormat, dtype: torch.dtype) -> Weight:
    """Random blocks whose products keep float activations (Weight.int8 unset), as every prompt's do."""
    return Weight(*quantize_blocks(rand(n, k, dtype=dtype, device=DEVICE, scale=k**-0.5), fmt), fmt)


def norm_inputs(m: int, k: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    return rand(m, k, dtype=dtype, device=DEVICE), rand(k, dtype=dtype, device=DEVICE, scale=0.2) + 1


def matmul_inputs(name: str, fmt: WeightFormat, m: int, k: int, dtype: torch.dtype) -> tuple:
    if name == "prefill_linear_residual":
        x, residual = rand(m, k, dtype=dtype, device=DEVICE), rand(m, N, dtype=dtype, device=DEVICE)
        return x, block_weight(N, k, fmt, dtype), residual
    if name == "prefill_swiglu":
        return *norm_inputs(m, k, dtype), block_weight(N, k, fmt, dtype), block_weight(N, k, fmt, dtype), EPS
    return *norm_inputs(m, k, dtype), block_weight(N, k, fmt, dtype), EPS


MATMULS = {"prefill_linear_residual": (prefill_linear_residual, reference.linear_residual),
           "prefill_swiglu": (prefill_swiglu, reference.rmsnorm_swiglu),
           "prefill_lm_head": (prefill_lm_head, reference.rmsnorm_lm_head)}


@pytest.mark.parametrize("dtype", DOT_DTYPES, ids=str)
@pytest.mark.parametrize("m", [1, 5, 37])
@pytest.mark.parametrize("fmt,k,cfg", CASES)
@pytest.mark.parametrize("name", MATMULS)
def test_matmul_on_blocks_matches_reference(launch, name, fmt, k, cfg, m, dtype):
    launch(cfg)
    kernel, ref = MATMULS[name]
    assert_matches(kernel, ref, matmul_inputs(name, fmt, m, k, dtype), {}, prefill_tolerance(name, dtype, None))


@pytest.mark.parametrize("dtype", DOT_DTYPES, ids=str)
@pytest.mark.parametrize("m,pos", [(1, 0), (5, 3), (37, 19)])
@pytest.mark.parametrize("fmt,k,cfg", CASES)
def test_qkv_rope_on_blocks_matches_reference(launch, fmt, k, cfg, m, pos, dtype):
    launch(cfg)
    smax = 64
    cos, sin = rope_tables(HEAD_DIM, smax, 10000.0, DEVICE)
    w = block_weight((HEADS + 2 * KV_HEADS) * HEAD_DIM, k, fmt, dtype)
    caches = [rand(KV_HEADS, smax, HEAD_DIM, dtype=dtype, device=DEVICE) for _ in range(2)]
    args = (*norm_inputs(m, k, dtype), w, cos, sin, torch.tensor(pos, device=DEVICE), *caches, EPS)
    assert_matches(prefill_qkv_rope, reference.rmsnorm_qkv_rope, args, {},
                   prefill_tolerance("prefill_qkv_rope", dtype, None))


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", [*BLOCKS, *K_QUANTS], ids=str)
@pytest.mark.parametrize("name", ["prefill_qkv_rope", "prefill_linear_residual[wo]", "prefill_swiglu",
                                  "prefill_linear_residual[w2]", "prefill_lm_head"])
@pytest.mark.parametrize("m", [77, 589])
def test_7b_shapes_on_blocks_in_bf16(name, fmt, m):
    """Llama-2-7B's weights in each block format, bf16 activations, the committed launch tables: 589 rows is past
    TMA_MIN_ROWS, where float weights take TMA loads and block weights still take pointer loads."""
    spec = PREFILL[name]
    args, kw = spec.make_inputs(MODEL_CONFIGS["llama-2-7b"], torch.bfloat16, DEVICE, m, 5, fmt)
    assert_matches(spec.kernel, spec.reference, args, kw, prefill_tolerance(name, torch.bfloat16, None))
