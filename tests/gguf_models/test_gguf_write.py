"""llamafast quantize into GGUF files: read back with gguf's own reader, the tensors are gguf-py's blocks under
llama.cpp's names and shapes, the metadata holds the keys llama.cpp's loader requires for a llama model, and the
tokenizer (SentencePiece, byte-level BPE tokenizer.json, a GGUF file's own) comes back from llamafast's reader as
it went in."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from llamafast.config import WeightFormat
from llamafast.formats import open_checkpoint
from llamafast.load import load_model, open_model
from llamafast.load.blocks import head_format
from llamafast.tools.quantize import quantize_checkpoint

from ..conftest import LLAMA2C, requires_llama2c
from ..formats import meta_state, write_hf, write_meta
from ..test_quantize import CPU, FORMATS, SMALL, TOK512, gguf_py
from .gguf_files import gguf_name, write_gguf

# What llama.cpp's loader reads for general.architecture llama (src/llama-model.cpp load_hparams, llama-vocab.cpp
# load): required ones fail the load when missing; the others would be guessed (head_count_kv = head_count, RoPE
# base 10000, BOS/EOS 1/2 for a SentencePiece vocabulary), so the file says them.
REQUIRED = {"general.architecture": "STRING", "llama.context_length": "UINT32", "llama.embedding_length": "UINT32",
            "llama.block_count": "UINT32", "llama.attention.layer_norm_rms_epsilon": "FLOAT32",
            "tokenizer.ggml.model": "STRING", "tokenizer.ggml.tokens": "ARRAY"}
STATED = {"llama.feed_forward_length": "UINT32", "llama.attention.head_count": "UINT32",
          "llama.attention.head_count_kv": "UINT32", "llama.rope.freq_base": "FLOAT32",
          "llama.rope.dimension_count": "UINT32", "general.file_type": "UINT32", "general.quantization_version": "UINT32",
          "tokenizer.ggml.scores": "ARRAY", "tokenizer.ggml.token_type": "ARRAY", "tokenizer.ggml.bos_token_id": "UINT32",
          "tokenizer.ggml.eos_token_id": "UINT32"}
SINGLE_SPACED = ["Once upon a time", "Lily's mom said: \"let's go!\" 123 héllo 🦙", "then\nnew lines\n\n"]
TEXTS = [*SINGLE_SPACED, " two  spaces,   three"]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    folder = tmp_path_factory.mktemp("source") / "meta"
    write_meta(folder, SMALL, meta_state(SMALL), tokenizer=TOK512)
    return folder


def read(path):
    from gguf import GGUFReader

    reader = GGUFReader(path)
    return reader, {t.name: t for t in reader.tensors}


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.value)
def test_tensors_are_gguf_py_blocks_under_llama_cpp_names(source, tmp_path, fmt):
    """Linear weights in fmt, output.weight in head_format(fmt), each gguf-py's bytes; GGML's shapes (columns
    first); norms F32 and the fp32 embedding table F32, as they were; Q/K rows in Meta's order, as llama.cpp's."""
    quantize_checkpoint(source, tmp_path / "m.gguf", fmt, device=CPU)
    reader, tensors = read(tmp_path / "m.gguf")
    state = meta_state(SMALL)
    assert set(tensors) == {gguf_name(n) for n in state}
    for name, w in state.items():
        t = tensors[gguf_name(name)]
        assert list(t.shape) == list(reversed(w.shape)), name
        if w.ndim == 1 or name == "tok_embeddings.weight":
            assert t.tensor_type.name == "F32" and np.array_equal(np.asarray(t.data).reshape(w.shape), w.numpy())
            continue
        kind = head_format(fmt) if name == "output.weight" else fmt
        assert t.tensor_type.name == kind.value.upper(), name
        assert np.array_equal(np.asarray(t.data).reshape(w.shape[0], -1), gguf_py(w, kind)), name
    assert all(t.data_offset % reader.alignment == 0 for t in tensors.values())


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.value)
def test_metadata_has_the_keys_llama_cpp_reads(source, tmp_path, fmt):
    from gguf import GGUFValueType, LlamaFileType

    quantize_checkpoint(source, tmp_path / "m.gguf", fmt, device=CPU)
    fields = read(tmp_path / "m.gguf")[0].fields
    for key, kind in {**REQUIRED, **STATED}.items():
        assert key in fields and fields[key].types[0] == GGUFValueType[kind], key
    value = {key: fields[key].contents() for key in REQUIRED | STATED}
    assert value["general.architecture"] == "llama" and value["tokenizer.ggml.model"] == "llama"
    assert value["general.file_type"] == LlamaFileType[f"MOSTLY_{fmt.value.upper()}"]
    c = open_checkpoint(source).config  # SMALL, with Meta's default context of 4096 (params.json has none)
    assert [value[f"llama.{k}"] for k in ("context_length", "embedding_length", "block_count", "feed_forward_length",
                                         "attention.head_count", "attention.head_count_kv", "rope.dimension_count")] \
        == [c.max_seq_len, c.dim, c.n_layers, c.hidden_dim, c.n_heads, c.n_kv_heads, c.head_dim]
    assert value["llama.attention.layer_norm_rms_epsilon"] == pytest.approx(c.norm_eps)
    assert len(value["tokenizer.ggml.tokens"]) == c.vocab_size and value["tokenizer.ggml.eos_token_id"] == 2


def test_llamafast_reads_it_back_with_the_same_config_and_tokenizer(source, tmp_path):
    """The reader sees the config written and blocks kept; the SentencePiece vocabulary, rebuilt from pieces and
    scores, encodes and decodes as tok512.model does (BOS aside: the GGUF tokenizer spells control pieces out)."""
    quantize_checkpoint(source, tmp_path / "m.gguf", WeightFormat.q4_0, device=CPU)
    opened, spm = open_model(tmp_path / "m.gguf"), open_model(source).tokenizer
    fields = ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "hidden_dim", "rope_theta", "max_seq_len")
    want = open_checkpoint(source).config
    assert [getattr(opened.config, f) for f in fields] == [getattr(want, f) for f in fields]
    assert opened.checkpoint.tensors["layers.0.attention.wq.weight"].fmt == WeightFormat.q4_0
    for text in SINGLE_SPACED:  # tok512 trims runs of spaces (SentencePiece's remove_extra_whitespaces), llama.cpp not
        ids = spm.encode(text)
        assert opened.tokenizer.encode(text) == ids and opened.tokenizer.decode(ids[1:]) == spm.decode(ids[1:]), text


@requires_llama2c
def test_llama2_sentencepiece_vocabulary_encodes_as_sentencepiece():
    """Llama 2's own tokenizer.model (32000 pieces, byte fallback, whitespace kept), through the metadata written
    and llamafast's GGUF tokenizer built from it, on every text."""
    from llamafast.tokenizers import Tokenizer
    from llamafast.tokenizers.gguf_vocab import gguf_tokenizer
    from llamafast.tokenizers.hf import from_gguf

    path = LLAMA2C / "tokenizer.model"
    fields = {key.removeprefix("tokenizer.ggml."): value for key, value, *_ in gguf_tokenizer(path, None, 32000)}
    ours, spm = from_gguf(fields, path), Tokenizer(path)
    assert (ours.bos_id, ours.eos_id, fields["add_space_prefix"]) == (1, 2, True)
    for text in TEXTS:
        assert ours.encode(text) == spm.encode(text), text


def test_a_byte_level_tokenizer_json_becomes_a_gpt2_vocabulary(tmp_path):
    """A byte-level BPE tokenizer.json (GPT-2's split; 300 pieces padded to the model's 512 ids) written as "gpt2"
    with its merges: llamafast's GGUF reader rebuilds a tokenizer that encodes every text as the JSON one does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXTS * 20, trainer)
    write_hf(tmp_path / "hf", SMALL, meta_state(SMALL))
    tok.save(str(tmp_path / "hf" / "tokenizer.json"))
    (tmp_path / "hf" / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|endoftext|>", "add_bos_token": False, "chat_template": "{{ messages[0]['content'] }}"}))
    quantize_checkpoint(tmp_path / "hf", tmp_path / "m.gguf", WeightFormat.q8_0, device=CPU)
    fields = read(tmp_path / "m.gguf")[0].fields
    assert fields["tokenizer.ggml.model"].contents() == "gpt2" and fields["tokenizer.ggml.pre"].contents() == "gpt2"
    merges = json.loads(tok.to_str())["model"]["merges"]
    assert fields["tokenizer.ggml.merges"].contents() == [m if isinstance(m, str) else " ".join(m) for m in merges]
    assert fields["tokenizer.ggml.token_type"].contents()[0] == 3 and fields["tokenizer.ggml.tokens"].contents()[-1] \
        == "[PAD511]"
    ours = open_model(tmp_path / "m.gguf").tokenizer
    assert ours.eos_id == 0 and ours.chat_template == "{{ messages[0]['content'] }}"
    for text in TEXTS:
        assert ours.encode(text) == tok.encode(text).ids, text


def test_a_gguf_source_keeps_its_tokenizer_fields_and_is_requantized_from_its_values(tmp_path):
    """A GGUF source's tokenizer.* fields are copied as they are (values and types); its Q4_1 blocks are read
    dequantized (gguf-py's values) and quantized again."""
    from gguf import GGMLQuantizationType, quants

    state = meta_state(SMALL)
    write_gguf(tmp_path / "src.gguf", SMALL, state, "Q4_1", chat_template="{{ bos_token }}")
    quantize_checkpoint(tmp_path / "src.gguf", tmp_path / "m.gguf", WeightFormat.q8_0, device=CPU)
    src, (out, tensors) = read(tmp_path / "src.gguf")[0], read(tmp_path / "m.gguf")

    def tokenizer_fields(reader):
        return {k: (f.types, f.contents()) for k, f in reader.fields.items() if k.startswith("tokenizer.")}

    assert tokenizer_fields(out) == tokenizer_fields(src) and "tokenizer.chat_template" in tokenizer_fields(out)
    w = state["layers.1.feed_forward.w2.weight"].numpy()
    values = quants.dequantize(quants.quantize(w, GGMLQuantizationType.Q4_1), GGMLQuantizationType.Q4_1)
    raw = np.asarray(tensors["blk.1.ffn_down.weight"].data)
    assert np.array_equal(raw, gguf_py(torch.from_numpy(values), WeightFormat.q8_0))


def test_llama31_rope_scaling_becomes_rope_freqs(tmp_path):
    """A Hugging Face rope_type llama3 config: the file carries rope_freqs.weight, llama.cpp's divisors, and the
    model read back rotates as the source does."""
    from ..test_weights import LLAMA31

    write_hf(tmp_path / "hf", SMALL, meta_state(SMALL), tokenizer=TOK512)
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    cfg.update(rope_scaling=LLAMA31, rope_theta=500000.0)
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))
    quantize_checkpoint(tmp_path / "hf", tmp_path / "m.gguf", WeightFormat.q8_0, device=CPU)
    assert read(tmp_path / "m.gguf")[1]["rope_freqs.weight"].tensor_type.name == "F32"
    ours, theirs = (load_model(p, device=CPU).model for p in (tmp_path / "m.gguf", tmp_path / "hf"))
    for model in (ours, theirs):
        model.setup_cache(64)
    assert open_checkpoint(tmp_path / "m.gguf").config.rope_freq_factors is not None
    torch.testing.assert_close(ours.rope_cos, theirs.rope_cos, atol=1e-5, rtol=0)
    torch.testing.assert_close(ours.rope_sin, theirs.rope_sin, atol=1e-5, rtol=0)


def test_bf16_embedding_stays_bf16(tmp_path):
    """The embedding table keeps its float type (BF16 here, its bit patterns as they were): lossless."""
    state = {n: t.bfloat16() for n, t in meta_state(SMALL, tied=True).items()}
    write_hf(tmp_path / "hf", SMALL, state, tied=True, tokenizer=TOK512, dtype=torch.bfloat16)
    quantize_checkpoint(tmp_path / "hf", tmp_path / "m.gguf", WeightFormat.q4_1, device=CPU)
    tensors = read(tmp_path / "m.gguf")[1]
    emb, head = tensors["token_embd.weight"], tensors["output.weight"]
    assert emb.tensor_type.name == "BF16" and head.tensor_type.name == "Q8_0"
    bits = state["tok_embeddings.weight"].view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(np.asarray(emb.data).view(np.uint16).reshape(bits.shape), bits)
