"""Tokenizer ids against llama2.c's test.c expectations, streaming detokenisation, chat template, stop strings."""

from __future__ import annotations

import pytest

from llamafast.load import bundled_model
from llamafast.tokenizers import StopMatcher, StreamDecoder, Tokenizer

from .conftest import LLAMA2C, requires_llama2c

# ../shared/testdata/llama2c/SOURCE.md: llama2.c test.c test_prompt_encodings, [BOS] + sp.encode(text).
LLAMA2_IDS = [
    ("", [1]),
    ("I believe the meaning of life is", [1, 306, 4658, 278, 6593, 310, 2834, 338]),
    ("Simply put, the theory of relativity states that ",
     [1, 3439, 17632, 1925, 29892, 278, 6368, 310, 14215, 537, 5922, 393, 29871]),
    ("A brief message congratulating the team on the launch:\n\n        Hi everyone,\n\n        I just ",
     [1, 319, 11473, 2643, 378, 629, 271, 18099, 278, 3815, 373, 278, 6826, 29901, 13, 13, 4706, 6324, 14332,
      29892, 13, 13, 4706, 306, 925, 29871]),
    ("Translate English to French:\n\n        sea otter => loutre de mer\n        peppermint => menthe poivrée\n"
     "        plush girafe => girafe peluche\n        cheese =>",
     [1, 4103, 9632, 4223, 304, 5176, 29901, 13, 13, 4706, 7205, 4932, 357, 1149, 301, 449, 276, 316, 2778, 13,
      4706, 1236, 407, 837, 524, 1149, 6042, 354, 772, 440, 29878, 1318, 13, 4706, 715, 1878, 330, 3055, 1725,
      1149, 330, 3055, 1725, 4639, 28754, 13, 4706, 923, 968, 1149]),
    ("Once upon a time", [1, 9038, 2501, 263, 931]),
]


@pytest.fixture(scope="module")
def llama2_tok():
    if not LLAMA2C.is_dir():
        pytest.skip(f"Llama 2 tokenizer not found at {LLAMA2C}")
    return Tokenizer(LLAMA2C / "tokenizer.model")


@requires_llama2c
@pytest.mark.parametrize("text,ids", LLAMA2_IDS)
def test_llama2_encode(llama2_tok, text, ids):
    assert llama2_tok.encode(text) == ids
    assert llama2_tok.decode(ids) == text


@requires_llama2c
def test_llama2_ids(llama2_tok):
    assert (llama2_tok.vocab_size, llama2_tok.bos_id, llama2_tok.eos_id) == (32000, 1, 2)


def _stream(tok: Tokenizer, context: list[int], ids: list[int]) -> list[str]:
    dec = StreamDecoder(tok, context)
    return [dec.push(i) for i in ids] + [dec.flush()]


@requires_llama2c
@pytest.mark.parametrize("text", ["Hello 👋 world", "日本語のテキスト", " leading space", "a\n\nb  c", "🦙🦙 ok"])
def test_stream_decoder_never_prints_half_characters(llama2_tok, text):
    context = llama2_tok.encode("Say:")
    ids = llama2_tok.encode(text, bos=False)
    deltas = _stream(llama2_tok, context, ids)
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == llama2_tok.decode(context + ids)[len(llama2_tok.decode(context)) :]


@requires_llama2c
def test_stream_decoder_splits_emoji_bytes(llama2_tok):
    """The llama emoji is four byte-fallback pieces: nothing is printed until the fourth arrives."""
    ids = llama2_tok.encode("🦙", bos=False)
    pieces = [llama2_tok.sp.IdToPiece(i) for i in ids]
    assert sum(p.startswith("<0x") for p in pieces) == 4
    deltas = _stream(llama2_tok, [1], ids)
    assert deltas[-2:] == ["🦙", ""] and all(d == "" for d in deltas[:-2])


def test_stream_decoder_keeps_leading_space():
    tok = Tokenizer(bundled_model().parent / "tok512.model")
    deltas = _stream(tok, tok.encode("Once upon"), tok.encode(" a time", bos=False))
    assert "".join(deltas) == " a time"


@requires_llama2c
def test_chat_template(llama2_tok):
    plain = llama2_tok.chat("Hi")
    assert plain == llama2_tok.encode("[INST] Hi [/INST]")
    with_system = llama2_tok.chat("Hi", system="Be brief.")
    assert llama2_tok.decode(with_system) == "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST]"


def _meta_chat_completion_tokens(tok: Tokenizer, dialog: list[dict]) -> list[int]:
    """Meta's llama/generation.py chat_completion, transcribed line by line (the oracle)."""
    if dialog[0]["role"] == "system":
        dialog = [{"role": dialog[1]["role"],
                   "content": "<<SYS>>\n" + dialog[0]["content"] + "\n<</SYS>>\n\n" + dialog[1]["content"]}] + dialog[2:]
    tokens = sum([tok.encode(f"[INST] {(p['content']).strip()} [/INST] {(a['content']).strip()} ") + [tok.eos_id]
                  for p, a in zip(dialog[::2], dialog[1::2])], [])
    return tokens + tok.encode(f"[INST] {(dialog[-1]['content']).strip()} [/INST]")


@requires_llama2c
@pytest.mark.parametrize("system,turns", [
    (None, ["Hi"]),
    ("  Be brief.\n", ["\n  Hi there  "]),
    ("", ["Hi"]),
    (" sys ", [" q1 ", "  a1\n", "\tq2"]),
    (None, ["q1", "a1", "q2", "a2", " q3 "]),
])
def test_chat_matches_meta_generation_py(llama2_tok, system, turns):
    """Whitespace in system and user text ends up where Meta's chat_completion puts it, in every position."""
    dialog = [{"role": "system", "content": system}] if system is not None else []
    dialog += [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
    assert llama2_tok.dialog(dialog) == _meta_chat_completion_tokens(llama2_tok, dialog)
    if len(turns) == 1:
        assert llama2_tok.chat(turns[0], system) == llama2_tok.dialog(dialog)


@pytest.mark.parametrize(
    "deltas,stops,expected",
    [
        (["Hello", " wor", "ld! Bye"], ["world"], "Hello "),
        (["ab", "c<", "/s", ">rest"], ["</s>"], "abc"),
        (["no stop", " here"], ["STOP"], "no stop here"),
        (["x\n", "\nUser:"], ["\n\n", "User:"], "x"),
        (["aaa", "ab"], ["aab"], "aa"),
    ],
)
def test_stop_strings_cut_exactly(deltas, stops, expected):
    m = StopMatcher(stops)
    out = ""
    for d in deltas:
        out += m.feed(d)
        if m.stopped:
            break
    out += "" if m.stopped else m.flush()
    assert out == expected


def test_stop_matcher_holds_back_only_possible_prefixes():
    m = StopMatcher(["###"])
    assert m.feed("ab#") == "ab"  # "#" may start "###"
    assert m.feed("c") == "#c"
