"""rmsnorm_qkv_rope against reference.rmsnorm_qkv_rope: q, and the k/v written into the cache at pos."""

from __future__ import annotations

import pytest
import torch

from llamafast.config import MODEL_CONFIGS, ModelConfig, Weight, WeightFormat
from llamafast.kernels import ON_GPU
from llamafast.measure.registry import REGISTRY, weight

from llamafast.kernels.gemv import gemv_key

from .common import (BLOCK_CASES, BLOCK_DTYPES, DEVICE, DTYPES, FLOAT_BLOCK_CASES, FP8, SHAPES, float_launch,
                     float_oracle, launches, oracle_weight, table_weights, tolerance)

SPEC = REGISTRY["rmsnorm_qkv_rope"]


@pytest.mark.parametrize("fp8", FP8, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("config", SHAPES)
@pytest.mark.parametrize("context", [1, 77])
def test_matches_reference(config, dtype, context, fp8):
    check_against_reference(config, dtype, context, fp8)


@pytest.mark.parametrize("dtype", BLOCK_DTYPES, ids=str)
@pytest.mark.parametrize("config,fmt", BLOCK_CASES)
def test_block_formats_match_reference(config, dtype, fmt):
    check_against_reference(config, dtype, 7, fmt)


# (shape, the q and k rows' format, the v rows'): llama.cpp's Q4_K_M and Q5_K_M give wv Q6_K in some layers; the
# k160's 192-row head is not a multiple of the interpreter's 64-row programs.
MIXED = [
    pytest.param(ModelConfig(dim=256, n_layers=1, n_heads=4, n_kv_heads=2, vocab_size=300, hidden_dim=768,
                             max_seq_len=80), WeightFormat.q4_k, WeightFormat.q6_k, id="k256-q4_k+q6_k"),
    pytest.param(ModelConfig(dim=256, n_layers=1, n_heads=4, n_kv_heads=2, vocab_size=300, hidden_dim=768,
                             max_seq_len=80), WeightFormat.q5_k, WeightFormat.q8_0, id="k256-q5_k+q8_0"),
    pytest.param(ModelConfig(dim=160, n_layers=1, n_heads=5, n_kv_heads=1, vocab_size=1000, hidden_dim=224,
                             max_seq_len=80), WeightFormat.q4_0, WeightFormat.q8_0, id="k160-q4_0+q8_0"),
    pytest.param(MODEL_CONFIGS["llama-2-7b"], WeightFormat.q4_k, WeightFormat.q6_k, id="7b-q4_k+q6_k",
                 marks=pytest.mark.gpu),
]


@pytest.mark.parametrize("dtype", BLOCK_DTYPES, ids=str)
@pytest.mark.parametrize("config,fmt,v_fmt", MIXED)
def test_v_rows_in_a_second_format_match_reference(config, dtype, fmt, v_fmt):
    (x, g, w, cos, sin, pos, k_cache, v_cache, eps), _ = SPEC.make_inputs(config, dtype, DEVICE, 7, None)
    head = weight(config.dim + config.kv_dim, config.dim, dtype, DEVICE, fmt)
    mixed = Weight(head.data, head.scale, fmt, tail=weight(config.kv_dim, config.dim, dtype, DEVICE, v_fmt), int8=True)
    assert mixed.shape == w.shape
    check_against_reference(config, dtype, 7, None, (x, g, mixed, cos, sin, pos, k_cache, v_cache, eps))


@pytest.mark.parametrize("config,fmt,v_fmt", [
    *[pytest.param(*p.values, None, id=p.id, marks=p.marks) for p in BLOCK_CASES], *MIXED])
def test_own_int8_matches_reference(config, fmt, v_fmt):
    """GemvConfig.own_int8: the kernel rounds x times RMSNorm's weight to int8 blocks itself, in the head's rows
    and the tail's alike."""
    (x, g, w, cos, sin, pos, k_cache, v_cache, eps), _ = SPEC.make_inputs(config, torch.float32, DEVICE, 7, fmt)
    if v_fmt is not None:
        head = weight(config.dim + config.kv_dim, config.dim, torch.float32, DEVICE, fmt)
        w = Weight(head.data, head.scale, fmt, tail=weight(config.kv_dim, config.dim, torch.float32, DEVICE, v_fmt),
                   int8=True)
    _, own = launches(w)
    check_against_reference(config, torch.float32, 7, None, (x, g, w, cos, sin, pos, k_cache, v_cache, eps),
                            {"configs": {gemv_key(w): own}})


@pytest.mark.parametrize("config,fmt,v_fmt", [
    *[pytest.param(*p.values, None, id=p.id, marks=p.marks) for p in FLOAT_BLOCK_CASES],
    *[p for p in MIXED if p.values[1] in (WeightFormat.q4_0, WeightFormat.q8_0)],
    pytest.param(MIXED[0].values[0], WeightFormat.q4_0, WeightFormat.q6_k, id="k256-q4_0+q6_k")])
def test_float_blocks_match_the_float_reference(config, fmt, v_fmt):
    """GemvConfig.float_blocks against the reference's float products, in the head's rows and a Q8_0 tail's; with
    a K-quant tail, which has no float loop, the whole launch rounds x to int8 itself, as the reference's int8
    model does."""
    (x, g, w, cos, sin, pos, k_cache, v_cache, eps), _ = SPEC.make_inputs(config, torch.float32, DEVICE, 7, fmt)
    if v_fmt is not None:
        head = weight(config.dim + config.kv_dim, config.dim, torch.float32, DEVICE, fmt)
        w = Weight(head.data, head.scale, fmt, tail=weight(config.kv_dim, config.dim, torch.float32, DEVICE, v_fmt),
                   int8=True)
    args = (x, g, w, cos, sin, pos, k_cache, v_cache, eps)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    q_ref = SPEC.reference(x, g, float_oracle(w), cos, sin, pos, k_ref, v_ref, eps)
    q = SPEC.kernel(*args, configs={gemv_key(w): float_launch(w)})
    for got, want in ((q, q_ref), (k_cache, k_ref), (v_cache, v_ref)):
        torch.testing.assert_close(got, want, **tolerance(torch.float32))


# A GPU model's own launches (kernels.ON_GPU) at their shapes: the committed table's are swept at 7B on the GPU.
OWN = [pytest.param(key, launch, id=f"{gpu.split()[1]}-{key[0]}x{key[1]}x{key[2]}", marks=pytest.mark.gpu)
       for gpu, tables in ON_GPU.items() for key, launch in tables.get("rmsnorm_qkv_rope", {}).items()]


@pytest.mark.parametrize("key,launch", OWN)
def test_a_gpus_own_launches_match_reference(key, launch):
    n, c, size = key
    config = ModelConfig(dim=c, n_layers=1, n_heads=c // 128, n_kv_heads=(n - c) // 256, vocab_size=256,
                         hidden_dim=4 * c, max_seq_len=64)
    args, _ = SPEC.make_inputs(config, torch.bfloat16, DEVICE, 7, table_weights(size))
    check_against_reference(config, torch.bfloat16, 7, None, inputs=args, launch={"configs": {key: launch}},
                            oracle=oracle_weight(args[2], launch))


def check_against_reference(config, dtype, context, fp8, inputs=None, launch=None, oracle=None):
    """oracle: the weight the reference multiplies, where it is not the kernel's (oracle_weight)."""
    args, kw = (inputs, {}) if inputs else SPEC.make_inputs(config, dtype, DEVICE, context, fp8)
    launch = launch or {}
    x, g, w, cos, sin, pos, k_cache, v_cache, eps = args
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    q_ref = SPEC.reference(x, g, oracle or w, cos, sin, pos, k_ref, v_ref, eps, **kw)
    q = SPEC.kernel(x, g, w, cos, sin, pos, k_cache, v_cache, eps, **kw, **launch)
    torch.testing.assert_close(q, q_ref, **tolerance(dtype))
    torch.testing.assert_close(k_cache, k_ref, **tolerance(dtype))  # position pos written, the rest untouched
    torch.testing.assert_close(v_cache, v_ref, **tolerance(dtype))


def test_writes_only_position_pos(tiny_config):
    (x, g, w, cos, sin, _, k_cache, v_cache, eps), _ = SPEC.make_inputs(tiny_config, torch.float32, DEVICE, 16)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    SPEC.kernel(x, g, w, cos, sin, torch.tensor(5, device=DEVICE), k_cache, v_cache, eps)
    changed = ((k_cache != before_k).any(-1) | (v_cache != before_v).any(-1)).any(0)  # (Smax,)
    assert changed.nonzero().flatten().tolist() == [5]
