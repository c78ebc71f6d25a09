"""The server's parts without a server: the prompt cache's reuse, token texts and bytes, the loopback check, and
the defaults the CLI writes down without importing the server."""

from __future__ import annotations

from llamafast.cli.serve import DEFAULT_MAX_QUEUE as CLI_MAX_QUEUE
from llamafast.generate import Completion
from llamafast.load import open_model
from llamafast.prompt_cache import PromptCache
from llamafast.serve import DEFAULT_MAX_QUEUE, is_loopback
from llamafast.serve.responses import TokenTexts


class _Engine:
    n_cached = 0


def test_prompt_cache_reuses_the_longest_common_prefix():
    cache = PromptCache(_Engine())
    assert cache.reuse([1, 5, 6]) == 0
    out = Completion([1, 5, 6], token_ids=[7, 8], finish_reason="eos")
    cache.engine.n_cached = 6  # prompt, 7, 8 and the EOS fed
    cache.record(out, eos_id=2)
    assert cache.ids == [1, 5, 6, 7, 8, 2]
    assert cache.reuse([1, 5, 6, 7, 9]) == 4 and cache.engine.n_cached == 4
    assert cache.reuse([1, 5, 6, 7]) == 3  # the whole prompt cached: its last token still runs


def test_token_texts_and_bytes():
    """A byte-fallback piece gives its byte; other tokens read as they do after the token before them."""
    tok = open_model(None).tokenizer
    texts = TokenTexts(tok)
    ids = tok.encode("á hi")  # [BOS, ▁, <0xC3>, <0xA1>, ▁h, i]
    assert [texts.piece(b, t) for b, t in zip(ids, ids[1:])][1:] == [[0xC3], [0xA1], " h", "i"]
    assert texts.text(ids[1], ids[2]) == "\ufffd"


def test_loopback():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.2") and not is_loopback("example.com")


def test_cli_default_queue_is_the_servers():
    assert CLI_MAX_QUEUE == DEFAULT_MAX_QUEUE
