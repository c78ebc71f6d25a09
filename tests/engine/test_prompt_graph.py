"""Prompt chunks padded to a bucket and replayed from CUDA graphs (llamafast/prompt_graph.py): the padded pass
gives the unpadded pass's logits and cache, on the CPU (reference path, and the prefill kernels through Triton's
interpreter) and from captured graphs on the GPU, also in chunks and from a cache offset as chat uses it."""

from __future__ import annotations

import pytest
import torch

from llamafast.config import Backend, DType, SamplingConfig
from llamafast.generate import Engine, generate, stream_tokens
from llamafast.load import load_model
from llamafast.prompt_graph import PromptGraphs, bucket

from ..conftest import TOLERANCES

GREEDY = SamplingConfig(temperature=0)


def test_bucket_pads_at_most_a_quarter_past_256():
    sizes = [bucket(n) for n in range(1, 4097)]
    assert all(b >= n for n, b in zip(range(1, 4097), sizes))
    assert sizes == sorted(sizes)  # a longer prompt never gets a shorter bucket
    assert all(b <= 1.25 * n for n, b in zip(range(257, 4097), sizes[256:]))
    assert bucket(1) == 64 and bucket(65) == 128 and bucket(300) == 320 and bucket(512) == 512
    assert bucket(1952) == 2048 == bucket(2048)  # a 4,000-token prompt's two chunks share one graph
    assert len(set(sizes)) == 3 + 4 * 4  # 64, 128, 256, then 4 per power of two up to 4096


def _padded_engine(model, max_len: int, chunk: int) -> Engine:
    engine = Engine(model, GREEDY, max_len, prefill_chunk=chunk)
    engine.prompts = PromptGraphs(model, chunk, capture=False)  # padded from each bucket's second chunk on
    return engine


def _cache(model, n: int) -> torch.Tensor:
    return torch.stack([torch.stack((b.k_cache[:, :n], b.v_cache[:, :n])) for b in model.layers])


@pytest.mark.parametrize("backend", [Backend.reference, pytest.param(Backend.triton, marks=pytest.mark.slow)])
def test_padded_prompt_gives_unpadded_logits_and_cache(golden, backend):
    """A 40-token prompt padded to 64 (triton: the prefill kernels in the interpreter on the CPU), after a first
    unpadded run of its bucket; then from offset 30, as a chat turn reuses the cache."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = load_model(None, device=device, dtype=DType.float32, backend=backend).model
    ids = torch.tensor(golden["prompt_once_upon_a_time"]["prompt_ids_with_bos"] * 8, device=device)[:40]
    plain = Engine(model, GREEDY, 128, prompt_graphs=False)
    want, want_cache = plain.prompt_logits(ids), _cache(model, 40)
    padded = _padded_engine(model, 128, 2048)
    first = padded.prompt_logits(ids)  # the bucket's first chunk: unpadded
    assert padded.prompts.seen == {64}
    got = padded.prompt_logits(ids)
    atol, rtol = TOLERANCES[torch.float32]
    torch.testing.assert_close(first, want, atol=atol, rtol=rtol)
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol)
    torch.testing.assert_close(_cache(model, 40), want_cache, atol=atol, rtol=rtol)
    torch.testing.assert_close(padded.prompt_logits(ids[30:], start=30), want, atol=atol, rtol=rtol)


def test_padded_chunks_give_golden_tokens(golden):
    """The 5-token prompt in chunks of 2 at offsets 0, 2 and 4 (bucket 64) on the reference path, twice: the
    golden greedy continuation both times. The cache holds 66 positions, so the chunk at 4, whose padding
    would run past it, stays unpadded."""
    lm = load_model(None, device=torch.device("cpu"))
    case = golden["prompt_once_upon_a_time"]
    engine = _padded_engine(lm.model, 66, 2)
    for _ in range(2):
        out = generate(engine, lm.tokenizer, case["prompt_ids_with_bos"], 60)
        assert out.token_ids == case["continuation_ids"][:60]


@pytest.mark.gpu
def test_graph_replays_give_golden_tokens(golden):
    """The triton backend on the GPU in fp32: eager, then captured, then replayed prompts (whole, and in chunks
    of 3 that attend to the cache the chunks before wrote) all give the golden continuation."""
    lm = load_model(None, device=torch.device("cuda"), dtype=DType.float32, backend=Backend.triton)
    case = golden["prompt_once_upon_a_time"]
    for chunk in (2048, 3):
        engine = Engine(lm.model, GREEDY, 256, prefill_chunk=chunk)
        for _ in range(3):
            assert generate(engine, lm.tokenizer, case["prompt_ids_with_bos"], 64).token_ids == case["continuation_ids"]
        assert engine.prompts.graphs, "no prompt graph was captured"


@pytest.mark.gpu
def test_graph_replay_matches_eager_logits(golden):
    """Replayed logits equal the eager pass's bit for bit at the padded length, and the unpadded pass's within
    fp32 summation order, at offsets 0 and 11."""
    lm = load_model(None, device=torch.device("cuda"), dtype=DType.float32, backend=Backend.triton)
    ids = torch.tensor(golden["prompt_once_upon_a_time"]["prompt_ids_with_bos"] * 8, device="cuda")[:50]
    engine = Engine(lm.model, GREEDY, 256)
    want = Engine(lm.model, GREEDY, 256, prompt_graphs=False).prompt_logits(ids)
    runs = [engine.prompt_logits(ids) for _ in range(3)]  # unpadded, padded + capture, replay
    assert 64 in engine.prompts.graphs
    assert torch.equal(runs[2], runs[1])
    atol, rtol = TOLERANCES[torch.float32]
    torch.testing.assert_close(runs[0], want, atol=atol, rtol=rtol)
    torch.testing.assert_close(runs[2], want, atol=atol, rtol=rtol)
    torch.testing.assert_close(engine.prompt_logits(ids[11:], start=11), want, atol=atol, rtol=rtol)


@pytest.mark.slow
def test_chat_after_warming_buckets_is_exact():
    """A chat whose engine warms buckets 64, 128 and 256 after each reply (padded passes past the cached sequence)
    and runs later prompts padded: every reply equals a fresh prefill of the whole conversation."""
    from llamafast.chat import ChatSession

    lm, ref = (load_model(None, device=torch.device("cpu"), dtype=DType.float32) for _ in range(2))  # two caches
    engine = _padded_engine(lm.model, 512, 2048)
    warmed = []
    warm = engine.prompts.warm
    engine.prompts.warm = lambda m, start: (warmed.append((m, start)), warm(m, start))[1]
    session = ChatSession(engine, lm.tokenizer, system="Be brief.", max_new_tokens=16)
    for k, text in enumerate(["Hello there", "Tell me a story about a cat", "What happened next?"]):
        reply = session.reply(text)
        conversation = session.transcript()["messages"][:-1]
        fresh = Engine(ref.model, GREEDY, 512, prompt_graphs=False)
        assert reply.token_ids == generate(fresh, lm.tokenizer, lm.tokenizer.dialog(conversation), 16).token_ids, k
        if k == 0:
            assert [m for m, _ in warmed] == [64, 128, 256] and warmed[0][1] == session.engine.n_cached


@pytest.mark.gpu
def test_bench_times_the_prompt_replayed_from_its_graph(monkeypatch):
    """bench's time to first token is that of a prompt whose bucket is captured, as every prompt after the first of
    its length runs: the timed pass neither runs the bucket eagerly nor captures it."""
    from llamafast.bench import decode

    seen = []

    def spy(engine, prompt, n, start=0):
        seen.append(bucket(len(prompt)) in engine.prompts.graphs)
        return stream_tokens(engine, prompt, n, start)

    monkeypatch.setattr(decode, "stream_tokens", spy)
    lm = load_model(None, device=torch.device("cuda"), backend=Backend.triton)
    decode.bench_backend(lm, Backend.triton, list(range(1, 17)), 64)  # a cache of 80 holds the padded bucket of 64
    assert seen[-1] and not seen[0], seen
