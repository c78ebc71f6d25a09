"""The decode GEMV kernels of the registry (llamafast/measure/registry.py) against their references, on the
registry's own inputs: linear_residual at the output (wo) and down (w2) projections, rmsnorm_swiglu, and
rmsnorm_lm_head (fp32 logits). Each returns its whole result, so one comparison covers it; the registry's other
kernels write into caches or keep state and have modules of their own."""

from __future__ import annotations

import pytest
import torch

from llamafast.config import ModelConfig
from llamafast.kernels import COMMITTED as TABLES
from llamafast.kernels import ON_GPU, linear_residual, rmsnorm_lm_head, rmsnorm_swiglu
from llamafast.measure.registry import REGISTRY
from llamafast.quant import FP8Format

from llamafast.kernels.gemv import GemvConfig, gemv_key, launch_args

from .common import (BLOCK_CASES, BLOCK_DTYPES, DEVICE, DTYPES, FLOAT_BLOCK_CASES, FP8, K_QUANTS, SHAPES,
                     float_launch, float_oracle, launches, oracle_weight, table_weights, tolerance)

GEMVS = [name for name, spec in REGISTRY.items() if spec.kernel in (linear_residual, rmsnorm_swiglu, rmsnorm_lm_head)]
# The registry's kernels tested by their own modules: test_rmsnorm_qkv_rope, test_decode_attention, test_sparse_ffn.
ELSEWHERE = {"rmsnorm_qkv_rope", "decode_attention", "sample_token[T 0.6 top-p 0.9]",  # test_sample_token.py
             "advance_state",  # test_advance_state.py
             *(n for n in REGISTRY if n.startswith("sparse_ffn["))}


def weight_at(name: str) -> int:
    """Where a GEMV's weight lies in its registry inputs: after x (linear_residual), after x and RMSNorm's g."""
    return 1 if name.startswith("linear_residual") else 2


def assert_matches_reference(spec, config: ModelConfig, dtype: torch.dtype, fp8: FP8Format | None) -> None:
    """The kernel and its torch reference on the same inputs (FP8 and block weights too), within the dtype's
    tolerance."""
    args, kw = spec.make_inputs(config, dtype, DEVICE, 1, fp8)
    torch.testing.assert_close(spec.kernel(*args, **kw), spec.reference(*args, **kw), **tolerance(dtype))


@pytest.mark.parametrize("name", GEMVS)
@pytest.mark.parametrize("fp8", FP8, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("config", SHAPES)
def test_matches_reference(config, dtype, fp8, name):
    assert_matches_reference(REGISTRY[name], config, dtype, fp8)


@pytest.mark.parametrize("name", GEMVS)
@pytest.mark.parametrize("dtype", BLOCK_DTYPES, ids=str)
@pytest.mark.parametrize("config,fmt", BLOCK_CASES)
def test_block_formats_match_reference(config, dtype, fmt, name):
    """Block weights against int8 activations (gemv_int8.py) and the reference's model of that arithmetic."""
    assert_matches_reference(REGISTRY[name], config, dtype, fmt)


@pytest.mark.parametrize("name", GEMVS)
@pytest.mark.parametrize("config,fmt", BLOCK_CASES)
def test_own_int8_equals_the_quantize_pass(config, fmt, name):
    """GemvConfig.own_int8: each tile rounds x (times RMSNorm's weight) to int8 blocks itself, the same integers
    and scales the quantize pass writes, so the results agree to fp32 summation order, and with the reference."""
    spec = REGISTRY[name]
    args, kw = spec.make_inputs(config, torch.float32, DEVICE, 1, fmt)
    w = args[weight_at(name)]
    passed, own = launches(w)
    got = spec.kernel(*args, **kw, configs={gemv_key(w): own})
    torch.testing.assert_close(got, spec.kernel(*args, **kw, configs={gemv_key(w): passed}), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got, spec.reference(*args, **kw), **tolerance(torch.float32))


@pytest.mark.parametrize("name", GEMVS)
@pytest.mark.parametrize("dtype", BLOCK_DTYPES, ids=str)
@pytest.mark.parametrize("config,fmt", FLOAT_BLOCK_CASES)
def test_float_blocks_match_the_float_reference(config, dtype, fmt, name):
    """GemvConfig.float_blocks: Q8_0, Q4_0 and Q4_1 weights dequantized in registers times float activations,
    against the reference that does the same (no int8 rounding); under PDL on a GPU."""
    spec = REGISTRY[name]
    args, kw = spec.make_inputs(config, dtype, DEVICE, 1, fmt)
    at = weight_at(name)
    w = args[at]
    got = spec.kernel(*args, **kw, configs={gemv_key(w): float_launch(w)})
    oracle = (*args[:at], float_oracle(w), *args[at + 1:])
    torch.testing.assert_close(got, spec.reference(*oracle, **kw), **tolerance(dtype))


@pytest.mark.parametrize("fmt", K_QUANTS, ids=str)
def test_k_quants_in_a_partial_tile(fmt):
    """K = 768 in 512-wide tiles: the second tile's last 256 weights, 8 blocks and a super-block, are masked."""
    from llamafast.measure.registry import rand, weight
    from llamafast.reference import linear_residual as reference

    torch.manual_seed(0)
    w = weight(40, 768, torch.float32, DEVICE, fmt)
    x, res = rand(1, 768, dtype=torch.float32, device=DEVICE), rand(1, 40, dtype=torch.float32, device=DEVICE)
    got = linear_residual(x, w, res, configs={gemv_key(w): GemvConfig(8, 512, 4)})
    torch.testing.assert_close(got, reference(x, w, res), **tolerance(torch.float32))


# Every committed launch of float, FP8 and block weights, at its own shape, a GPU model's own too (kernels.ON_GPU):
# (registry kernel, key, launch) where the registry kernel's inputs take the key's (N, K) as (F, C), (C, F) or
# (V, C); the tensor-parallel shards' shapes are among them.
COMMITTED = [pytest.param(name, key, launch, id=f"{name}-{key[0]}x{key[1]}x{key[2]}{gpu}", marks=pytest.mark.gpu)
             for gpu, tables in (("", TABLES), *((f"-{g.split()[1]}", t) for g, t in ON_GPU.items()))
             for name in ("rmsnorm_swiglu", "linear_residual[w2]", "rmsnorm_lm_head")
             for key, launch in tables.get(name.partition("[")[0], {}).items() if len(key) == 3]


@pytest.mark.parametrize("name,key,launch", COMMITTED)
def test_committed_launches_match_reference(name, key, launch):
    """Each launch a table commits, run at its own shape, matches the reference (a float_blocks launch's: on
    float activations)."""
    n, k, size = key
    dim, hidden, vocab = {"rmsnorm_swiglu": (k, n, 256), "rmsnorm_lm_head": (k, 4 * k, n)}.get(name, (n, k, 256))
    config = ModelConfig(dim=dim, n_layers=1, n_heads=dim // 128, hidden_dim=hidden, vocab_size=vocab)
    spec = REGISTRY[name]
    args, kw = spec.make_inputs(config, torch.bfloat16, DEVICE, 1, table_weights(size))
    got = spec.kernel(*args, **kw, configs={key: launch})
    at = weight_at(name)
    oracle = (*args[:at], oracle_weight(args[at], launch), *args[at + 1:])
    torch.testing.assert_close(got, spec.reference(*oracle, **kw), **tolerance(torch.bfloat16))


def test_every_registry_kernel_is_tested():
    """A kernel added to the registry lands here, or in a module of its own named in ELSEWHERE."""
    assert GEMVS == ["linear_residual[wo]", "rmsnorm_swiglu", "linear_residual[w2]", "rmsnorm_lm_head"]
    assert set(REGISTRY) == set(GEMVS) | ELSEWHERE


def test_a_launch_takes_pdl_where_its_weights_would_not(monkeypatch):
    """GemvConfig.pdl launches FP8 weights under programmatic dependent launch, which gemv.use_pdl leaves them
    without; float weights take it either way; a GPU without it (here: the CPU, unpatched) never does."""
    from llamafast.kernels import gemv
    from llamafast.measure.registry import weight

    fp8, bf16 = weight(64, 64, torch.float32, DEVICE, FP8Format.e5m2), weight(64, 64, torch.float32, DEVICE, None)
    plain, chosen = GemvConfig(2, 64, 1), GemvConfig(2, 64, 1, pdl=True)
    assert not launch_args(chosen, fp8, pdl=True)["launch_pdl"]
    monkeypatch.setattr(gemv, "pdl_capable", lambda device: True)
    pdl = {(cfg, w is fp8): launch_args(cfg, w, pdl=True)["PDL"] for cfg in (plain, chosen) for w in (fp8, bf16)}
    assert pdl == {(plain, True): False, (chosen, True): True, (plain, False): True, (chosen, False): True}
    assert "PDL" not in launch_args(chosen, fp8)  # a kernel that takes no PDL
