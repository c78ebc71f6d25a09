"""Sharded loading: every rank's slices, from every checkpoint format, concatenate back to weights.load_state's
full tensors; random shards to random_state's; bad tensor-parallel sizes and sparsified checkpoints refused.
(C dim, D head_dim, KV kv_dim, V vocab; stories260K: 8 heads, 4 KV heads, FFN 172, vocabulary 512.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from llamafast.config import ModelConfig
from llamafast.errors import LlamafastError
from llamafast.formats import open_checkpoint
from llamafast.tools.convert import convert_fp8
from llamafast.formats.writer import save_checkpoint, state_specs
from llamafast.load import bundled_model
from llamafast.quant import FP8Format, quantize_named
from llamafast.load.shard import Shard, check_shardable, load_shard, local_shapes, random_shard
from llamafast.load.weights import load_state, random_state

from ..formats import meta_state, write_hf, write_meta
from ..gguf_models.gguf_files import write_gguf

CPU = torch.device("cpu")


def _make(kind: str, dst: Path, copies: Path) -> Path:
    """stories260K in checkpoint format `kind`, written under dst (or the stories_copies fixture's, in copies)."""
    if kind in ("meta", "hf"):
        return copies / kind
    if kind == "llama2c":
        return bundled_model()
    ckpt = open_checkpoint(bundled_model())
    if kind.startswith("meta_"):  # split across files along fairscale's dims, a file boundary inside a rank's rows
        state = torch.load(copies / "meta" / "consolidated.00.pth", weights_only=True)
        config = open_checkpoint(copies / "meta").config  # its multiple_of, unlike the .bin header's
        write_meta(dst, config, {k: v for k, v in state.items() if k != "rope.freqs"}, int(kind[-1]))
    elif kind == "llamafast":
        state = load_state(ckpt, CPU, torch.float32)
        save_checkpoint(dst, ckpt.config, state_specs(state, skip=["output.weight"]), state.__getitem__,
                        {"weights": "native"}, None)
    elif kind.startswith("fp8_"):
        convert_fp8(bundled_model(), dst, FP8Format(kind[4:]), device=CPU)
    elif kind == "gguf":
        dst.mkdir()
        state = {k: v for k, v in load_state(ckpt, CPU, torch.float32).items() if k != "output.weight"}
        unfused = {}
        for name, t in state.items():
            if ".wqkv." in name:  # GGUF keeps wq, wk, wv apart
                c = ckpt.config
                for part, rows in zip(("wq", "wk", "wv"), t.split([c.dim, c.kv_dim, c.kv_dim])):
                    unfused[name.replace("wqkv", part)] = rows
            else:
                unfused[name] = t
        write_gguf(dst / "model.gguf", ckpt.config, unfused, "F16")  # Q8_0 blocks need 32 | 172
        return dst / "model.gguf"
    return dst


FORMATS = ["meta", "meta_2", "meta_3", "hf", "llama2c", "llamafast", "fp8_e5m2", "fp8_e4m3", "gguf"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, stories_copies) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ckpts")
    return {kind: _make(kind, root / kind, stories_copies) for kind in FORMATS}


def _unshard(shards: list[dict], config: ModelConfig) -> dict[str, torch.Tensor]:
    """The full state from every rank's: each tensor concatenated as its slicing says, or checked replicated."""
    n, full = len(shards), {}
    for name in shards[0]:
        parts = [s[name] for s in shards]
        kind, what = name.split(".")[-2:]
        if kind == "wqkv":  # each rank's [q; k; v]: the q parts, then the k parts, then the v parts
            split = [p.split([config.dim // n, config.kv_dim // n, config.kv_dim // n]) for p in parts]
            full[name] = torch.cat([torch.cat([s[i] for s in split]) for i in range(3)])
        elif kind in ("wo", "w2") and what == "weight":
            full[name] = torch.cat(parts, 1)
        elif kind in ("w1", "w3") or (kind == "output" and config.vocab_size % n == 0):
            full[name] = torch.cat(parts)
        else:
            assert all(torch.equal(p, parts[0]) for p in parts), f"{name} differs between ranks"
            full[name] = parts[0]
    return full


def _check(full: dict, shards: list[dict], config: ModelConfig) -> None:
    for rank, state in enumerate(shards):
        shapes = {n: tuple(t.shape) for n, t in state.items() if not n.endswith(".scale")}
        assert shapes == local_shapes(config, Shard(rank, len(shards)))
        assert all(t.is_contiguous() for t in state.values())
    rebuilt = _unshard(shards, config)
    assert rebuilt.keys() == full.keys()
    for name, t in full.items():
        assert rebuilt[name].dtype == t.dtype and torch.equal(rebuilt[name], t), name


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("kind", FORMATS)
def test_shards_concatenate_to_the_full_state(checkpoints, kind, world):
    ckpt = open_checkpoint(checkpoints[kind])
    shards = [load_shard(ckpt, Shard(r, world), CPU, torch.float32) for r in range(world)]
    _check(load_state(ckpt, CPU, torch.float32), shards, ckpt.config)


def test_tied_head_is_a_view_of_the_embedding(checkpoints):
    ckpt = open_checkpoint(checkpoints["llama2c"])
    state = load_shard(ckpt, Shard(1, 2), CPU, torch.float32)
    emb, head = state["tok_embeddings.weight"], state["output.weight"]
    assert head.untyped_storage().data_ptr() == emb.untyped_storage().data_ptr() and torch.equal(head, emb[256:])


@pytest.mark.parametrize("fmt", list(FP8Format))
def test_fp8_at_load_quantizes_each_slice(checkpoints, fmt):
    """Tied stories260K: the head is its own FP8 copy of the rank's embedding rows; E4M3 scales of wo and w2
    are over the rank's columns, so each tensor is checked against the quantized slice of the float one."""
    ckpt = open_checkpoint(checkpoints["llama2c"])
    world = 2
    shards = [load_shard(ckpt, Shard(r, world), CPU, torch.float32, fp8=fmt) for r in range(world)]
    floats = [load_shard(ckpt, Shard(r, world), CPU, torch.float32) for r in range(world)]
    for state, plain in zip(shards, floats):
        assert state["output.weight"].dtype == torch.int8
        for name, t in plain.items():
            if state[name].dtype == torch.int8:
                q, scale, _ = quantize_named(t, fmt, name)
                assert torch.equal(state[name], q), name
                if scale is not None:
                    assert torch.equal(state[name.removesuffix("weight") + "scale"], scale), name
    if fmt == FP8Format.e5m2:  # no scales: the slices of the quantized model exactly
        _check(load_state(ckpt, CPU, torch.float32, fp8=fmt), shards, ckpt.config)
    with pytest.raises(LlamafastError, match="drop --fp8"):
        load_shard(open_checkpoint(checkpoints["fp8_e5m2"]), Shard(0, 2), CPU, torch.float32, fp8=fmt)


def test_head_replicated_when_vocabulary_does_not_divide(tmp_path):
    config = ModelConfig(dim=32, n_layers=1, n_heads=8, n_kv_heads=4, vocab_size=510, multiple_of=8, max_seq_len=64)
    write_hf(tmp_path, config, meta_state(config))
    ckpt = open_checkpoint(tmp_path)
    shards = [load_shard(ckpt, Shard(r, 4), CPU, torch.float32) for r in range(4)]
    assert not Shard(0, 4).vocab_sharded(config) and shards[3]["output.weight"].shape == (510, 32)
    _check(load_state(ckpt, CPU, torch.float32), shards, config)


@pytest.mark.parametrize("kind", ["hf", "llamafast", "fp8_e4m3", "meta_2"])
def test_slices_never_load_the_whole_tensor(checkpoints, kind):
    ckpt = open_checkpoint(checkpoints[kind])
    full = load_state(ckpt, CPU, torch.float32)

    def whole():
        raise AssertionError("a sliced tensor was loaded whole")

    sliced = (".wq.", ".wk.", ".wv.", ".wqkv.", ".wo.weight", ".w1.", ".w2.weight", ".w3.", "output.")
    for name, ref in ckpt.tensors.items():
        if any(s in name for s in sliced):
            ref.load = whole
    shards = [load_shard(ckpt, Shard(r, 2), CPU, torch.float32) for r in range(2)]
    _check(full, shards, ckpt.config)


@pytest.mark.parametrize("fp8", [None, *FP8Format])
def test_random_shards_are_slices_of_random_state(fp8):
    config = ModelConfig(dim=64, n_layers=2, n_heads=8, n_kv_heads=4, vocab_size=510, multiple_of=4, max_seq_len=64)
    full = random_state(config, CPU, torch.float32, seed=3)
    shards = [random_shard(config, Shard(r, 2), CPU, torch.float32, seed=3) for r in range(2)]
    if fp8 is None:
        _check(full, shards, config)
        return
    quantized = [random_shard(config, Shard(r, 2), CPU, torch.float32, seed=3, fp8=fp8) for r in range(2)]
    for state, plain in zip(quantized, shards):
        for name, t in plain.items():
            if name.endswith("norm.weight") or name == "tok_embeddings.weight":
                assert torch.equal(state[name], t)
                continue
            q, scale, _ = quantize_named(t, fp8, name)
            assert torch.equal(state[name], q), name
            assert scale is None or torch.equal(state[name.removesuffix("weight") + "scale"], scale)


def test_sizes_that_do_not_divide_are_refused(checkpoints):
    ckpt = open_checkpoint(checkpoints["llama2c"])
    message = ("--tp 3: the model's 8 query heads, 4 KV heads and 172 FFN neurons must each divide by the "
               "tensor-parallel size; 1, 2, 4 do")
    with pytest.raises(LlamafastError, match="^" + message.replace(".", r"\.") + "$"):
        check_shardable(ckpt.config, 3)
    with pytest.raises(LlamafastError, match="--tp 3"):
        load_shard(ckpt, Shard(0, 3), CPU, torch.float32)
    with pytest.raises(LlamafastError, match="--tp 8"):
        random_shard(ckpt.config, Shard(0, 8), CPU, torch.float32)
    check_shardable(ckpt.config, 4)
    with pytest.raises(LlamafastError, match="outside"):
        Shard(2, 2)


def test_sparsified_checkpoint_refused(checkpoints):
    ckpt = open_checkpoint(checkpoints["llamafast"])
    ckpt.metadata["sparse"] = json.dumps({"group_size": 4, "levels": [0.0, 1.0]})  # what llamafast sparsify records
    with pytest.raises(LlamafastError, match="tensor parallel does not run sparsified checkpoints"):
        load_shard(ckpt, Shard(0, 2), CPU, torch.float32)


@pytest.mark.parametrize("kind", FORMATS)
def test_staging_jobs_hold_the_rank_slices(checkpoints, kind):
    """On a GPU load_shard stages each tensor through pinned buffers (weights.staged): every tensor of every
    format makes a job whose parts, filled into a buffer as the reader threads do, are the direct read's slices."""
    from llamafast.load.staging import _fill
    from llamafast.load.weights import as_stored
    from llamafast.load.shard import _direct, _job, _plan

    ckpt = open_checkpoint(checkpoints[kind])
    for rank in range(2):
        for name, sources in _plan(ckpt, Shard(rank, 2), None).items():
            job = _job(ckpt, name, sources)
            assert job is not None, name
            filled = _fill(job, torch.empty(job.nbytes, dtype=torch.uint8))
            assert torch.equal(as_stored(name, filled, CPU, torch.float32), _direct(ckpt, sources, CPU, torch.float32))


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["hf", "meta_2", "fp8_e4m3", "gguf"])
def test_staged_shards_equal_the_cpu_ones(checkpoints, kind):
    ckpt = open_checkpoint(checkpoints[kind])
    for rank in range(2):
        gpu = load_shard(ckpt, Shard(rank, 2), torch.device("cuda"), torch.float32)
        cpu = load_shard(ckpt, Shard(rank, 2), CPU, torch.float32)
        assert gpu.keys() == cpu.keys() and all(torch.equal(gpu[n].cpu(), cpu[n]) for n in cpu)
