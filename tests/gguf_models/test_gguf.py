"""GGUF models: SmolLM2-135M-Instruct from the test data against transformers' own GGUF loading (greedy tokens,
tokenizer ids, chat template; tests/data/golden_smollm2.json, made by scripts/smollm2_golden.py), and files
written with the gguf package's writer in every supported tensor type against gguf's own dequantizer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from llamafast.backends import build
from llamafast.config import ModelConfig, SamplingConfig
from llamafast.formats import open_checkpoint
from llamafast.generate import Engine, stream_tokens
from llamafast.load import bundled_model, load_model, open_model
from llamafast.tokenizers import StreamDecoder
from llamafast.tokenizers.chat import render_chat_template
from llamafast.load.weights import block_formats, load_state

from ..conftest import TESTDATA
from ..formats import fused, meta_state, write_hf
from .gguf_files import encode, gguf_name, write_gguf

SMOLLM2 = TESTDATA / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
GOLDEN = json.loads((Path(__file__).parents[1] / "data" / "golden_smollm2.json").read_text())
requires_smollm2 = pytest.mark.skipif(not SMOLLM2.is_file(), reason=f"SmolLM2 GGUF not found at {SMOLLM2}")


@pytest.fixture(scope="module")
def smollm2():
    return load_model(SMOLLM2, device=torch.device("cpu"))  # fp32 on the CPU, as the golden run


@requires_smollm2
def test_config_and_formats(smollm2):
    c = smollm2.model.config
    assert (c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.hidden_dim, c.vocab_size) == (576, 30, 9, 3, 1536, 49152)
    assert c.rope_theta == 100000.0 and c.max_seq_len == 8192 and smollm2.format == "gguf"
    assert smollm2.model.output.weight is smollm2.model.tok_embeddings.weight  # tied


@requires_smollm2
@pytest.mark.parametrize("case", GOLDEN["greedy"], ids=lambda c: c["prompt"])
def test_greedy_tokens_equal_transformers(smollm2, case):
    """The reference backend in fp32 on the CPU gives transformers' fp32 greedy tokens exactly (EOS included)."""
    tok = smollm2.tokenizer
    ids = tok.encode(case["prompt"])
    assert ids == case["prompt_ids"]
    want = case["continuation_ids"]
    engine = Engine(smollm2.model, SamplingConfig(temperature=0), len(ids) + len(want), n_vocab=tok.vocab_size)
    assert list(stream_tokens(engine, ids, len(want))) == want


@requires_smollm2
@pytest.mark.parametrize("case", GOLDEN["tokenizer"], ids=lambda c: repr(c["text"])[:30])
def test_tokenizer_ids_equal_transformers(case):
    tok = open_model(SMOLLM2).tokenizer
    assert tok.encode(case["text"], bos=False) == case["ids"]
    assert tok.decode(case["ids"]) == case["text"]


@requires_smollm2
@pytest.mark.parametrize("case", GOLDEN["chat"], ids=lambda c: str(len(c["messages"])))
def test_chat_template_renders_as_transformers(case):
    tok = open_model(SMOLLM2).tokenizer
    assert render_chat_template(tok.chat_template, case["messages"], "<|im_start|>", "<|im_end|>") == case["text"]
    assert tok.dialog(case["messages"]) == tok.encode(case["text"], bos=False)


@requires_smollm2
def test_streaming_is_exact_for_byte_level_pieces():
    """Emoji and CJK split over byte-level pieces: the streamed deltas add up to the text, never a half character."""
    tok = open_model(SMOLLM2).tokenizer
    text = "emoji 🦙🔥 ok, CJK 日本語の文章と中文"
    ids = tok.encode(text, bos=False)
    decoder = StreamDecoder(tok, [])
    deltas = [decoder.push(i) for i in ids] + [decoder.flush()]
    assert "".join(deltas) == text and not any("\ufffd" in d for d in deltas)


# --- files written by the gguf package, each supported tensor type ------------------------------------------

SMALL = ModelConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=512, multiple_of=32, max_seq_len=64)
WIDE = ModelConfig(dim=256, n_layers=1, n_heads=4, n_kv_heads=2, vocab_size=512, hidden_dim=256, max_seq_len=64)
TYPES = [("F32", SMALL), ("F16", SMALL), ("BF16", SMALL), ("Q8_0", SMALL), ("Q4_0", SMALL), ("Q4_1", SMALL),
         ("Q4_K", WIDE), ("Q5_K", WIDE), ("Q6_K", WIDE),  # K-quant blocks hold 256 values: rows of 256
         ("Q5_0", SMALL), ("Q5_1", SMALL), ("IQ4_NL", SMALL), ("Q2_K", WIDE), ("Q3_K", WIDE)]  # read as floats


@pytest.mark.parametrize("kind,config", TYPES, ids=[t for t, _ in TYPES])
def test_written_gguf_logits_equal_its_dequantized_weights(tmp_path, kind, config):
    """The loader (names, reversed shapes, row order, dequantization) against the same file's tensors
    dequantized by gguf.quants and put into the model directly."""
    from gguf import GGMLQuantizationType, quants

    state = meta_state(config)
    write_gguf(tmp_path / "m.gguf", config, state, kind)
    ckpt = open_checkpoint(tmp_path / "m.gguf")
    assert ckpt.format == "gguf" and f"{kind} x" in ckpt.metadata["tensor_types"]
    as_float = kind not in ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K")
    matrices = sum(t.dim() == 2 for t in state.values())  # every one in `kind`, the norms in F32
    assert ckpt.metadata.get("read_as_float") == (f"{kind} x{matrices}" if as_float else None)
    shape = ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "hidden_dim", "rope_theta", "max_seq_len")
    assert [getattr(ckpt.config, f) for f in shape] == [getattr(config, f) for f in shape]
    assert ckpt.config.norm_eps == pytest.approx(config.norm_eps)  # stored as float32
    ours = build(config, load_state(ckpt, torch.device("cpu"), torch.float32), formats=block_formats(ckpt))
    rng = np.random.default_rng(0)  # the writer's blocks, made again in the same order
    expected = {}
    for name, t in state.items():
        data = t.float().numpy()
        if data.ndim == 2 and kind != "F32":
            data = quants.dequantize(encode(data, kind, rng), GGMLQuantizationType[kind])
        expected[name] = torch.from_numpy(np.array(data, dtype=np.float32))
    assert gguf_name("layers.0.attention.wq.weight") == "blk.0.attn_q.weight"
    theirs = build(config, fused(expected))
    tokens, pos = torch.tensor([0, 5, 17, 300, 42, 9]), torch.zeros((), dtype=torch.long)
    for model in (ours, theirs):
        model.setup_cache(16)
    torch.testing.assert_close(ours(tokens, pos, True), theirs(tokens, pos, True), atol=1e-5, rtol=1e-5)


def test_written_gguf_generates_with_its_embedded_tokenizer(tmp_path):
    write_gguf(tmp_path / "m.gguf", SMALL, meta_state(SMALL), "Q8_0", chat_template="{{ messages[0]['content'] }}!")
    lm = load_model(tmp_path / "m.gguf", device=torch.device("cpu"))
    assert lm.tokenizer.encode("hi", bos=False) == [lm.tokenizer.tok.token_to_id("h"), lm.tokenizer.tok.token_to_id("i")]
    assert lm.tokenizer.decode(lm.tokenizer.chat("hi")) == "hi!"


def test_tokenizer_json_with_its_config(tmp_path):
    """A Hugging Face checkpoint that ships tokenizer.json and tokenizer_config.json (bos, eos, chat_template)."""
    write_gguf(tmp_path / "m.gguf", SMALL, meta_state(SMALL), "F32")
    embedded = load_model(tmp_path / "m.gguf", device=torch.device("cpu")).tokenizer
    write_hf(tmp_path / "hf", SMALL, meta_state(SMALL))
    embedded.tok.save(str(tmp_path / "hf" / "tokenizer.json"))
    config = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "add_bos_token": True,
              "chat_template": "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"}
    (tmp_path / "hf" / "tokenizer_config.json").write_text(json.dumps(config))
    lm = load_model(tmp_path / "hf", device=torch.device("cpu"))
    tok = lm.tokenizer
    assert tok.encode("héllo") == [0] + embedded.encode("héllo", bos=False) and tok.decode(tok.encode("héllo")[1:]) == "héllo"
    assert tok.decode(tok.chat("hi", system="sys")) == "[system] sys\n[user] hi\n"


def test_chat_template_list_takes_the_default(tmp_path):
    """transformers' list form of chat_template ({"name", "template"} each): a chat without tools uses "default"."""
    write_gguf(tmp_path / "m.gguf", SMALL, meta_state(SMALL), "F32")
    embedded = load_model(tmp_path / "m.gguf", device=torch.device("cpu")).tokenizer
    write_hf(tmp_path / "hf", SMALL, meta_state(SMALL))
    embedded.tok.save(str(tmp_path / "hf" / "tokenizer.json"))
    templates = [{"name": "tool_use", "template": "tools {{ messages[0]['content'] }}"},
                 {"name": "default", "template": "<{{ messages[0]['content'] }}>"}]
    config = {"eos_token": "<|endoftext|>", "chat_template": templates}
    (tmp_path / "hf" / "tokenizer_config.json").write_text(json.dumps(config))
    tok = open_model(tmp_path / "hf").tokenizer
    assert tok.decode(tok.chat("hi")) == "<hi>"


SPM_TEXTS = ["", "Hello world", " leading space", "two  spaces", "new\nlines\n\n", "emoji 🦙 ok", "CJK 日本語",
             "digits 1234567890", "Once upon a time, there was a little girl named Lily."]


def _spm_fields(model: Path) -> dict:
    """What llama.cpp's converter writes for a SentencePiece tokenizer.model (tokenizer.ggml.*)."""
    from sentencepiece import SentencePieceProcessor

    sp = SentencePieceProcessor(model_file=str(model))
    kinds = [3 if sp.is_control(i) else 2 if sp.is_unknown(i) else 6 if sp.is_byte(i) else 1 for i in range(len(sp))]
    return {"model": "llama", "tokens": [sp.id_to_piece(i) for i in range(len(sp))],
            "scores": [sp.get_score(i) for i in range(len(sp))], "token_type": kinds, "bos_token_id": sp.bos_id(),
            "eos_token_id": sp.eos_id(), "unknown_token_id": sp.unk_id()}


@pytest.mark.parametrize("model", ["bundled", "llama2"])
def test_sentencepiece_style_gguf_tokenizer_equals_sentencepiece(model):
    """A GGUF's llama (SentencePiece) vocabulary, rebuilt through the tokenizers library, encodes and decodes as
    SentencePiece itself does: the bundled tok512, and Llama 2's own 32000-piece tokenizer."""
    from llamafast.tokenizers import Tokenizer
    from llamafast.tokenizers.hf import from_gguf

    from ..conftest import LLAMA2C

    path = bundled_model().with_name("tok512.model") if model == "bundled" else LLAMA2C / "tokenizer.model"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    spm, ours = Tokenizer(path), from_gguf(_spm_fields(path), path.with_suffix(".gguf"))
    # tok512 also collapses runs of whitespace (SentencePiece's remove_extra_whitespaces), which a GGUF does not
    # record and llama.cpp does not do either; Llama 2's tokenizer keeps them, so it takes every text.
    texts = SPM_TEXTS if model == "llama2" else [t for t in SPM_TEXTS if "  " not in t and not t.startswith(" ")]
    for text in texts:
        assert ours.encode(text) == spm.encode(text), text
        assert ours.decode(spm.encode(text, bos=False)) == spm.decode(spm.encode(text, bos=False)), text


def test_gguf_straight_to_fp8(tmp_path):
    """--fp8 quantizes the dequantized GGUF weights as they stream; the LM head (tied) gets its own FP8 copy."""
    from llamafast.quant import FP8Format

    write_gguf(tmp_path / "m.gguf", SMALL, meta_state(SMALL), "Q8_0")
    lm = load_model(tmp_path / "m.gguf", device=torch.device("cpu"), fp8=FP8Format.e4m3)
    assert lm.weights == "fp8_e4m3" and lm.model.layers[0].attention.wqkv.weight.dtype == torch.int8
    assert lm.model.output.weight.dtype == torch.int8 and lm.model.tok_embeddings.weight.dtype == torch.float32


def test_convert_fp8_of_a_gguf_keeps_its_tokenizer_and_template(tmp_path):
    """convert-fp8 writes the GGUF's own tokenizer as tokenizer.json + tokenizer_config.json (never the GGUF file
    itself as tokenizer.model), so the converted model encodes and chats as the GGUF did."""
    from llamafast.tools.convert import convert_fp8

    write_gguf(tmp_path / "m.gguf", SMALL, meta_state(SMALL), "Q4_1", chat_template="<{{ messages[0]['content'] }}>")
    convert_fp8(tmp_path / "m.gguf", tmp_path / "fp8", device=torch.device("cpu"))
    assert {p.name for p in (tmp_path / "fp8").iterdir()} == {"model.safetensors", "tokenizer.json",
                                                              "tokenizer_config.json"}
    a, b = load_model(tmp_path / "m.gguf", device=torch.device("cpu")), load_model(tmp_path / "fp8", device=torch.device("cpu"))
    assert b.weights == "fp8_e5m2" and b.tokenizer.encode("héllo wörld") == a.tokenizer.encode("héllo wörld")
    assert b.tokenizer.decode(b.tokenizer.chat("hi")) == "<hi>"


def test_reader_leaves_numpy_memmap_as_it_was(tmp_path):
    """formats/gguf.py swaps numpy.memmap only while the reader parses (plain views are 3x faster to slice)."""
    memmap = np.memmap
    write_gguf(tmp_path / "m.gguf", SMALL, meta_state(SMALL), "F16")
    open_checkpoint(tmp_path / "m.gguf")
    assert np.memmap is memmap
    (tmp_path / "bad.gguf").write_bytes(b"GGUF" + b"\0" * 10)
    with pytest.raises(Exception, match="not a readable GGUF"):
        open_checkpoint(tmp_path / "bad.gguf")
    assert np.memmap is memmap


def test_llama31_rope_freqs_in_gguf_equal_the_llama3_scaling():
    """llama.cpp stores Llama 3.1's RoPE scaling as rope_freqs.weight, a divisor per frequency: the model's rotation
    tables equal those of the same scaling read from a Hugging Face config (rope_type llama3)."""
    import tempfile

    from llamafast.model import llama3_frequencies, rope_tables

    d, theta, scaling = SMALL.head_dim, 500000.0, (8.0, 1.0, 4.0, 32)
    plain = 1.0 / (theta ** (torch.arange(0, d, 2).float() / d))
    factors = (plain / llama3_frequencies(plain, *scaling)).numpy()
    config = ModelConfig(**{**SMALL.__dict__, "rope_theta": theta})
    with tempfile.TemporaryDirectory() as tmp:
        write_gguf(Path(tmp) / "m.gguf", config, meta_state(config), "F32", rope_freqs=factors)
        lm = load_model(Path(tmp) / "m.gguf", device=torch.device("cpu"))
    lm.model.setup_cache(64)
    want_cos, want_sin = rope_tables(d, 64, theta, "cpu", scaling)
    torch.testing.assert_close(lm.model.rope_cos, want_cos, atol=1e-5, rtol=0)
    torch.testing.assert_close(lm.model.rope_sin, want_sin, atol=1e-5, rtol=0)
    assert not torch.allclose(lm.model.rope_cos, rope_tables(d, 64, theta, "cpu")[0], atol=1e-3)
