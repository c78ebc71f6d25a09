"""Loaders on small synthetic checkpoints: every format gives the same model as the weights it was written from."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from llamafast.formats import open_checkpoint
from llamafast.config import ModelConfig
from llamafast.errors import LlamafastError
from llamafast.backends import build
from llamafast.formats.writer import save_checkpoint, state_specs
from llamafast.load.weights import load_state

from .formats import fused, meta_state, write_hf, write_llama2c_v1, write_meta


def _logits(model, tokens: list[int]) -> torch.Tensor:
    model.setup_cache(32)
    return model(torch.tensor(tokens), torch.zeros((), dtype=torch.long), all_logits=True)


def _loaded(path) -> torch.nn.Module:
    ckpt = open_checkpoint(path)
    return build(ckpt.config, load_state(ckpt, torch.device("cpu"), torch.float32))


def _expected(config: ModelConfig, state: dict) -> torch.Tensor:
    return _logits(build(config, fused(state)), TOKENS)


TOKENS = [1, 5, 17, 300, 42, 9, 511]


@pytest.mark.parametrize("n_shards", [1, 2, 4])
def test_meta_shards_merge(tmp_path, tiny_config, n_shards):
    state = meta_state(tiny_config)
    write_meta(tmp_path, tiny_config, state, n_shards)
    ckpt = open_checkpoint(tmp_path)
    assert ckpt.format == "meta" and ckpt.config.hidden_dim == 88 and ckpt.config.vocab_size == 512
    torch.testing.assert_close(_logits(_loaded(tmp_path), TOKENS), _expected(tiny_config, state), atol=0, rtol=0)


def test_meta_70b_style_gqa_one_kv_head_per_shard(tmp_path):
    """Llama-2-70B: 8 KV heads over 8 shards, so each shard holds one head of wk and wv."""
    config = ModelConfig(dim=64, n_layers=1, n_heads=16, n_kv_heads=4, vocab_size=512, multiple_of=16)
    state = meta_state(config)
    write_meta(tmp_path, config, state, n_shards=4)
    torch.testing.assert_close(_logits(_loaded(tmp_path), TOKENS), _expected(config, state), atol=0, rtol=0)


@pytest.mark.parametrize("n_shards,tied", [(1, False), (3, False), (2, True)])
def test_hf_unpermutes_and_reads_sharded_index(tmp_path, tiny_config, n_shards, tied):
    state = meta_state(tiny_config, tied=tied)
    write_hf(tmp_path, tiny_config, state, n_shards, tied)
    if n_shards > 1:
        assert (tmp_path / "model.safetensors.index.json").is_file()
    model = _loaded(tmp_path)
    assert (model.output.weight is model.tok_embeddings.weight) == tied
    torch.testing.assert_close(_logits(model, TOKENS), _expected(tiny_config, state), atol=0, rtol=0)


def test_hf_without_unpermute_would_differ(tmp_path, tiny_config):
    """Guards the test above: the permutation changes the model, so skipping the inverse would be caught."""
    state = meta_state(tiny_config)
    write_hf(tmp_path, tiny_config, state)
    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        stored = f.get_tensor("model.layers.0.self_attn.q_proj.weight")
    assert not torch.equal(stored, state["layers.0.attention.wq.weight"])
    ckpt = open_checkpoint(tmp_path)
    assert torch.equal(ckpt.tensors["layers.0.attention.wq.weight"].load(), state["layers.0.attention.wq.weight"])


@pytest.mark.parametrize("shared", [True, False])
def test_llama2c_version1(tmp_path, tiny_config, shared):
    state = meta_state(tiny_config, tied=shared)
    write_llama2c_v1(tmp_path / "model.bin", tiny_config, state, shared)
    model = _loaded(tmp_path / "model.bin")
    assert (model.output.weight is model.tok_embeddings.weight) == shared
    torch.testing.assert_close(_logits(model, TOKENS), _expected(tiny_config, state), atol=0, rtol=0)


def test_llamafast_round_trip(tmp_path, tiny_config):
    state = fused(meta_state(tiny_config))
    dst = tmp_path / "out"
    save_checkpoint(dst, tiny_config, state_specs(state), state.__getitem__, {"weights": "native"}, None)
    ckpt = open_checkpoint(dst)
    assert ckpt.format == "llamafast" and ckpt.config == tiny_config and ckpt.metadata["weights"] == "native"
    torch.testing.assert_close(_logits(_loaded(dst), TOKENS), _logits(build(tiny_config, state), TOKENS), atol=0, rtol=0)


def test_save_is_atomic_and_refuses_to_overwrite(tmp_path, tiny_config):
    state = fused(meta_state(tiny_config))
    dst = tmp_path / "out"

    def failing(name):
        if name == "norm.weight":
            raise RuntimeError("disk full")
        return state[name]

    with pytest.raises(RuntimeError):
        save_checkpoint(dst, tiny_config, state_specs(state), failing, {}, None)
    assert list(tmp_path.iterdir()) == []  # no dst, no temporary directory left behind
    save_checkpoint(dst, tiny_config, state_specs(state), state.__getitem__, {}, None)
    with pytest.raises(LlamafastError, match="--force"):
        save_checkpoint(dst, tiny_config, state_specs(state), state.__getitem__, {}, None)
    save_checkpoint(dst, tiny_config, state_specs(state), state.__getitem__, {}, None, force=True)


def test_cpu_load_keeps_memory_map(tmp_path, tiny_config):
    """fp32 on the CPU: the model's tensors are views of the mapped file, not a second copy."""
    state = meta_state(tiny_config)
    write_meta(tmp_path, tiny_config, state)
    ckpt = open_checkpoint(tmp_path)
    mapped = ckpt.tensors["layers.0.attention.wo.weight"].load()
    loaded = load_state(ckpt, torch.device("cpu"), torch.float32)
    assert loaded["layers.0.attention.wo.weight"].data_ptr() == mapped.data_ptr()


def test_params_json_mismatch_is_named(tmp_path, tiny_config):
    state = meta_state(tiny_config)
    write_meta(tmp_path, tiny_config, state)
    (tmp_path / "params.json").write_text((tmp_path / "params.json").read_text().replace('"dim": 32', '"dim": 64'))
    with pytest.raises(LlamafastError, match=r"has shape \[512, 32\] but params.json implies \[512, 64\]"):
        load_state(open_checkpoint(tmp_path), torch.device("cpu"), torch.float32)


def test_missing_layer_is_named(tmp_path, tiny_config):
    state = {k: v for k, v in meta_state(tiny_config).items() if not k.startswith("layers.1.")}
    write_meta(tmp_path, tiny_config, state)
    with pytest.raises(LlamafastError, match=r"layers\.1\.attention\.wq\.weight and 8 more missing"):
        load_state(open_checkpoint(tmp_path), torch.device("cpu"), torch.float32)


LLAMA31 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 64}


@pytest.mark.parametrize("layout", ["rope_scaling", "rope_parameters"])
def test_llama31_rope_scaling_in_either_layout(tmp_path, tiny_config, layout):
    """Llama 3.1's rope_type llama3, in transformers 4's rope_scaling or transformers 5's rope_parameters, changes
    only the rotation tables: low frequencies slowed by the factor, high ones kept (transformers' formula when
    transformers is installed)."""
    import json

    from llamafast.model import rope_tables

    write_hf(tmp_path, tiny_config, meta_state(tiny_config))
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg[layout] = {**LLAMA31, "rope_theta": 500000.0} if layout == "rope_parameters" else LLAMA31
    cfg["rope_theta"] = 500000.0
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    config = open_checkpoint(tmp_path).config
    assert config.rope_scaling == (8.0, 1.0, 4.0, 64) and config.rope_theta == 500000.0
    cos, _ = rope_tables(64, 128, 500000.0, "cpu", config.rope_scaling)
    plain, _ = rope_tables(64, 128, 500000.0, "cpu")
    assert torch.equal(cos[:, 0], plain[:, 0]) and not torch.equal(cos[:, -1], plain[:, -1])
    try:
        from transformers import LlamaConfig
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    except ImportError:
        return
    hf = LlamaConfig(hidden_size=64 * 4, num_attention_heads=4, max_position_embeddings=128, rope_theta=500000.0,
                     rope_scaling=LLAMA31)
    inv_freq, _ = ROPE_INIT_FUNCTIONS["llama3"](hf, "cpu")
    angles = torch.outer(torch.arange(128).float(), inv_freq.float())
    torch.testing.assert_close(cos, torch.cos(angles), atol=1e-6, rtol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["meta", "hf"])
def test_gpu_staged_load_equals_cpu_load(tmp_path, tiny_config, fmt):
    """The pinned staging pipeline (load/staging.py) delivers every tensor bit for bit, converted on the GPU."""
    state = meta_state(tiny_config)
    (write_meta if fmt == "meta" else write_hf)(tmp_path, tiny_config, state, 2)
    ckpt = open_checkpoint(tmp_path)
    on_cpu = load_state(ckpt, torch.device("cpu"), torch.bfloat16)
    on_gpu = load_state(ckpt, torch.device("cuda"), torch.bfloat16)
    assert on_cpu.keys() == on_gpu.keys()
    for name, t in on_cpu.items():
        assert torch.equal(on_gpu[name].cpu(), t), name


def test_random_fp8_is_made_tensor_by_tensor_with_the_same_numbers():
    """random_model with fp8 quantizes each tensor as it is drawn (the float model never exists whole), and gets
    exactly what quantizing the whole float model gave."""
    from llamafast.config import FP8Format, model_config
    from llamafast.load import random_model
    from llamafast.load.weights import quantize_state, random_state

    for fmt in FP8Format:
        model = random_model("stories260K", torch.device("cpu"), fp8=fmt).model
        whole = quantize_state(random_state(model_config("stories260K"), torch.device("cpu"), torch.bfloat16), fmt)
        state = model.state_dict()
        for name, t in whole.items():
            assert torch.equal(state[name], t), (fmt, name)
