"""llamafast quantize into llamafast checkpoints: the blocks written are gguf-py's bit for bit, the checkpoint loads
and decodes exactly as the same model quantized in memory (load.block_copy), on the reference backend and the
Triton interpreter; interrupted writes leave nothing; what runs no block weights refuses them; info describes them.
The GGUF output has its own tests (tests/gguf_models/test_gguf_write.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from llamafast.cli import app
from llamafast.config import Backend, ModelConfig, SamplingConfig, WeightFormat
from llamafast.errors import LlamafastError
from llamafast.formats import open_checkpoint
from llamafast.formats.writer import save_checkpoint, state_specs
from llamafast.generate import Engine, stream_tokens
from llamafast.load import block_copy, bundled_model, load_model
from llamafast.load.blocks import head_format
from llamafast.quant import to_gguf_blocks
from llamafast.tools import quantize as quantize_module
from llamafast.tools.describe import describe_checkpoint
from llamafast.tools.quantize import quantize_checkpoint

from .formats import fused, meta_state, write_hf, write_meta

# Rows of whole 32-weight blocks: dim 64, FFN width 192 (stories260K's 172 is not); GQA 2:1, tok512's vocabulary.
SMALL = ModelConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=512, multiple_of=32, max_seq_len=64)
TOK512 = bundled_model().with_name("tok512.model")
FORMATS = [WeightFormat.q8_0, WeightFormat.q4_0, WeightFormat.q4_1]
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A float Meta checkpoint (fp32, untied head) of SMALL's shape, with meta_state(SMALL)'s weights."""
    folder = tmp_path_factory.mktemp("source") / "meta"
    write_meta(folder, SMALL, meta_state(SMALL), tokenizer=TOK512)
    return folder


def gguf_py(w: torch.Tensor, fmt: WeightFormat) -> np.ndarray:
    """What gguf-py's reference quantizer makes of fp32 weights: GGUF's bytes, one row of blocks per weight row."""
    from gguf import GGMLQuantizationType, quants

    return quants.quantize(w.float().numpy(), GGMLQuantizationType[fmt.value.upper()])


def greedy(model, ids: list[int], n: int) -> list[int]:
    return list(stream_tokens(Engine(model, SamplingConfig(temperature=0), len(ids) + n), ids, n))


def logits(model, ids: list[int]) -> torch.Tensor:
    model.setup_cache(16)
    return model(torch.tensor(ids), torch.zeros((), dtype=torch.long), True)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.value)
def test_blocks_written_equal_gguf_py(source, tmp_path, fmt):
    """Every linear weight (wqkv fused) in fmt and the LM head in head_format(fmt), each block gguf-py's bytes once
    put back in GGUF's layout; the embedding table and the norms as they were; the metadata says so."""
    report = quantize_checkpoint(source, tmp_path / "q", fmt, device=CPU)
    ckpt = open_checkpoint(tmp_path / "q")
    meta, t = ckpt.metadata, ckpt.tensors
    assert ckpt.format == "llamafast" and meta["weights"] == fmt.value and meta["lm_head"] == head_format(fmt).value
    assert meta["source_format"] == "meta" and (tmp_path / "q" / "tokenizer.model").is_file()
    state = fused(meta_state(SMALL))
    linear = [n for n in state if n.endswith(("wqkv.weight", "wo.weight", "w1.weight", "w2.weight", "w3.weight"))]
    for name in [*linear, "output.weight"]:
        kind = head_format(fmt) if name == "output.weight" else fmt
        scale = t[name.removesuffix("weight") + "scale"]
        assert scale.dtype == torch.float16
        assert np.array_equal(to_gguf_blocks(t[name].load(), scale.load(), kind).numpy(), gguf_py(state[name], kind))
    for name in ("tok_embeddings.weight", "norm.weight", "layers.1.ffn_norm.weight"):
        assert torch.equal(t[name].load(), state[name])
    assert len(report.stats) == len(linear) + 1 and all(0 < s.rel_rms_err < 0.15 for s in report.stats)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.value)
@pytest.mark.parametrize("suffix", ["", ".gguf"], ids=["llamafast", "gguf"])
def test_quantized_model_decodes_as_the_in_memory_block_copy(source, tmp_path, fmt, suffix):
    """Both outputs load as block weights and give the logits and greedy tokens of the source model quantized on
    load (block_copy), exactly: the same blocks through the same ops; the GGUF file's SentencePiece vocabulary
    encodes as tok512.model does."""
    ours = load_model(quantize_checkpoint(source, tmp_path / f"q{suffix}", fmt, device=CPU).dst, device=CPU,
                      backend=Backend.reference)
    theirs = block_copy(load_model(source, device=CPU, backend=Backend.reference), fmt)
    ids = ours.tokenizer.encode("Once upon a time")
    assert ids == [1, 403, 407, 261, 378]
    assert fmt.value in ours.weights and ours.model.layers[1].feed_forward.w2.fmt == fmt
    assert ours.model.output.fmt == head_format(fmt)
    assert torch.equal(logits(ours.model, ids), logits(theirs.model, ids))
    assert greedy(ours.model, ids, 8) == greedy(theirs.model, ids, 8)


def test_quantized_checkpoint_on_the_triton_interpreter(source, tmp_path):
    """The decode kernels' block path on a quantized checkpoint (Triton's interpreter on the CPU), against the
    reference backend on the same checkpoint: a 2-token prompt, 2 tokens."""
    if torch.cuda.is_available():
        pytest.skip("the GPU tests cover the triton backend")
    quantize_checkpoint(source, tmp_path / "q", WeightFormat.q4_1, device=CPU)
    ids = [1, 403]
    ref = load_model(tmp_path / "q", device=CPU, backend=Backend.reference).model
    fused_model = load_model(tmp_path / "q", device=CPU, backend=Backend.triton).model
    assert greedy(fused_model, ids, 2) == greedy(ref, ids, 2)


def test_tied_bf16_source_gets_its_own_head(tmp_path):
    """A tied Hugging Face bf16 source: the head is a Q8_0 copy of the embedding table, which stays bf16."""
    state = meta_state(SMALL, tied=True)
    state = {n: t.bfloat16() for n, t in state.items()}
    write_hf(tmp_path / "hf", SMALL, state, tied=True, tokenizer=TOK512, dtype=torch.bfloat16)
    quantize_checkpoint(tmp_path / "hf", tmp_path / "q", WeightFormat.q4_0, device=CPU)
    t = open_checkpoint(tmp_path / "q").tensors
    assert t["tok_embeddings.weight"].dtype == torch.bfloat16
    assert torch.equal(t["tok_embeddings.weight"].load(), state["tok_embeddings.weight"])
    head = to_gguf_blocks(t["output.weight"].load(), t["output.scale"].load(), WeightFormat.q8_0).numpy()
    assert np.array_equal(head, gguf_py(state["tok_embeddings.weight"], WeightFormat.q8_0))


@pytest.mark.parametrize("suffix", ["", ".gguf"], ids=["llamafast", "gguf"])
def test_an_interrupted_quantize_leaves_nothing(source, tmp_path, monkeypatch, suffix):
    calls, real = [], quantize_module.quantize_blocks

    def failing(w, fmt):
        calls.append(fmt)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real(w, fmt)

    monkeypatch.setattr(quantize_module, "quantize_blocks", failing)
    with pytest.raises(KeyboardInterrupt):
        quantize_checkpoint(source, tmp_path / f"q{suffix}", WeightFormat.q4_0, device=CPU)
    assert list(tmp_path.iterdir()) == []


def test_force_replaces_a_gguf_file_and_an_interrupted_one_keeps_it(source, tmp_path, monkeypatch):
    dst = tmp_path / "m.gguf"
    quantize_checkpoint(source, dst, WeightFormat.q8_0, device=CPU)
    before = dst.read_bytes()
    with pytest.raises(LlamafastError, match="exists; pass --force"):
        quantize_checkpoint(source, dst, WeightFormat.q4_0, device=CPU)
    monkeypatch.setattr(quantize_module, "quantize_blocks", lambda w, fmt: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        quantize_checkpoint(source, dst, WeightFormat.q4_0, force=True, device=CPU)
    assert dst.read_bytes() == before and list(tmp_path.iterdir()) == [dst]
    monkeypatch.undo()
    (tmp_path / ".m.gguf.llamafast-tmp-999999999-x").write_bytes(b"left by a write killed with SIGKILL")
    quantize_checkpoint(source, dst, WeightFormat.q4_0, force=True, device=CPU)
    assert open_checkpoint(dst).metadata["tensor_types"].startswith("Q4_0") and list(tmp_path.iterdir()) == [dst]


def test_a_fused_float_llamafast_source_splits_into_gguf_q_k_v(tmp_path):
    """A llamafast float checkpoint stores wqkv fused: the GGUF file gets wq, wk and wv apart, each its rows' blocks."""
    from gguf import GGUFReader

    state = meta_state(SMALL)
    flat = fused(state)
    save_checkpoint(tmp_path / "lf", SMALL, state_specs(flat), flat.__getitem__, {},
                    lambda folder: shutil.copyfile(TOK512, folder / "tokenizer.model"))
    quantize_checkpoint(tmp_path / "lf", tmp_path / "m.gguf", WeightFormat.q8_0, device=CPU)
    tensors = {t.name: t for t in GGUFReader(tmp_path / "m.gguf").tensors}
    for kind, name in (("q", "wq"), ("k", "wk"), ("v", "wv")):
        raw = np.asarray(tensors[f"blk.1.attn_{kind}.weight"].data)
        assert np.array_equal(raw, gguf_py(state[f"layers.1.attention.{name}.weight"], WeightFormat.q8_0))


def test_what_runs_no_blocks_refuses_a_block_checkpoint(source, tmp_path):
    """Tensor parallel (load_shard) and --fp8 refuse in one line, before any weight is read."""
    from llamafast.load.shard import Shard, load_shard
    from llamafast.quant import FP8Format

    quantize_checkpoint(source, tmp_path / "q", WeightFormat.q4_0, device=CPU)
    with pytest.raises(LlamafastError, match="tensor parallel runs float and FP8 weights, not q4_0 blocks"):
        load_shard(open_checkpoint(tmp_path / "q"), Shard(0, 2), CPU, torch.float32)
    with pytest.raises(LlamafastError, match="already holds q4_0 weights; drop --fp8"):
        load_model(tmp_path / "q", device=CPU, fp8=FP8Format.e5m2)


def test_sparsify_keeps_a_block_checkpoint_s_blocks(source, tmp_path):
    """A llamafast block checkpoint sparsified: its layers stay Q4_0 (its head Q8_0), w2t becomes Q8_0, and info
    counts each as stored."""
    from llamafast.tools.sparsify import sparsify

    quantize_checkpoint(source, tmp_path / "q", WeightFormat.q4_0, device=CPU)
    text = "Once upon a time, there was a little girl named Lily. She liked to play in the park. " * 20
    sparsify(tmp_path / "q", tmp_path / "s", text, "t.txt", 0.5, group_size=4, device=CPU)
    lm = load_model(tmp_path / "s", device=CPU)
    ff = lm.model.layers[1].feed_forward
    assert (ff.w1.fmt, ff.w2t.fmt, lm.model.output.fmt) == (WeightFormat.q4_0, WeightFormat.q8_0, WeightFormat.q8_0)
    info = describe_checkpoint(tmp_path / "s")
    assert info["formats"]["ffn"] == "q4_0+q8_0+float32" and info["formats"]["attention"] == "q4_0"
    c, n = SMALL, SMALL.hidden_dim // 4
    layer = (c.qkv_dim * c.dim + c.dim * c.dim + 2 * c.hidden_dim * c.dim) // 32 * 18 + c.hidden_dim * c.dim // 32 * 34
    router = (n * c.dim + n + 2 * 20) * 4  # fp32 routers and tables: the source's dtype
    blocks = c.n_layers * (layer + router) + c.vocab_size * c.dim // 32 * 34
    assert info["weight_bytes_per_token"] == blocks + (2 * c.n_layers + 1) * c.dim * 4 + c.dim * 4


def test_block_scales_must_be_fp16(source, tmp_path):
    """validate checks a block checkpoint's dtypes: fp32 scales are refused by name, not misread."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    quantize_checkpoint(source, tmp_path / "q", WeightFormat.q8_0, device=CPU)
    file = tmp_path / "q" / "model.safetensors"
    with safe_open(str(file), "pt") as f:
        tensors, meta = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    tensors["layers.0.attention.wo.scale"] = tensors["layers.0.attention.wo.scale"].float()
    save_file(tensors, file, metadata=meta)
    with pytest.raises(LlamafastError, match="layers.0.attention.wo.scale has dtype torch.float32; q8_0"):
        load_model(tmp_path / "q", device=CPU)


def test_info_shows_formats_and_stored_bytes(source, tmp_path):
    """Bytes per token count the blocks as stored (18 bytes per 32 Q4_0 weights, 34 per Q8_0 head block), the
    norms and one fp32 embedding row; parameters count weights, not bytes."""
    quantize_checkpoint(source, tmp_path / "q", WeightFormat.q4_0, device=CPU)
    info = describe_checkpoint(tmp_path / "q")
    c = SMALL
    layer = c.qkv_dim * c.dim + c.dim * c.dim + 3 * c.hidden_dim * c.dim
    blocks = c.n_layers * layer // 32 * 18 + c.vocab_size * c.dim // 32 * 34
    norms = (2 * c.n_layers + 1) * c.dim * 4
    assert info["weight_bytes_per_token"] == blocks + norms + c.dim * 4
    assert info["parameters"] == c.n_layers * layer + 2 * c.vocab_size * c.dim + norms // 4
    assert info["weights"] == "q4_0" and info["formats"] == {
        "attention": "q4_0", "ffn": "q4_0", "lm_head": "q8_0", "embedding": "float32", "norms": "float32"}
    r = CliRunner().invoke(app, ["info", "--model", str(tmp_path / "q")])
    assert r.exit_code == 0 and "attention: q4_0, ffn: q4_0, lm_head: q8_0, embedding: float32" in r.stdout


def test_cli_reports_and_writes(source, tmp_path):
    r = CliRunner().invoke(app, ["quantize", str(source), str(tmp_path / "m.gguf"), "--format", "q4_1", "--device",
                                 "cpu"])
    assert r.exit_code == 0, r.stderr
    assert "layers.1.feed_forward.w2.weight" in r.stdout and "GGUF file: q4_1, LM head q8_0" in r.stderr
    r = CliRunner().invoke(app, ["quantize", str(source), str(tmp_path / "q"), "--format", "q8_0", "--json"])
    assert r.exit_code == 0, r.stderr
    import json

    report = json.loads(r.stdout)
    assert report["output"] == "llamafast" and report["format"] == "q8_0" and len(report["stats"]) == 11


def test_eval_and_bench_quantize_from_a_block_base(source, tmp_path):
    """eval scores block variants of a float model, and FP8 variants of a block checkpoint (its blocks dequantized
    first, as --fp8 reads a GGUF file's); bench --fp8 times the FP8 copy beside the block model."""
    import json

    r = CliRunner().invoke(app, ["eval", "--model", str(source), "--variant", "q8_0", "--variant", "q4_1",
                                 "--prompts", "1", "--tokens", "8", "--device", "cpu", "--json"])
    assert r.exit_code == 0, r.stderr
    rows = {row["name"]: row for row in json.loads(r.stdout)["results"]}
    assert rows["q8_0"]["kl_mean"] < rows["q4_1"]["kl_mean"]
    quantize_checkpoint(source, tmp_path / "q", WeightFormat.q4_0, device=CPU)
    r = CliRunner().invoke(app, ["eval", "--model", str(tmp_path / "q"), "--prompts", "1", "--tokens", "8",
                                 "--device", "cpu", "--json"])
    assert r.exit_code == 0, r.stderr
    assert [row["name"] for row in json.loads(r.stdout)["results"]] == ["base (q4_0)", "fp8_e5m2", "fp8_e4m3"]
    r = CliRunner().invoke(app, ["bench", "decode", "--model", str(tmp_path / "q"), "--fp8", "--device", "cpu",
                                 "--new-tokens", "4", "--prompt-len", "4", "--json"])
    assert r.exit_code == 0, r.stderr
    assert [row["weights"] for row in json.loads(r.stdout)["results"]] == ["q4_0", "fp8_e5m2"]
