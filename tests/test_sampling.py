"""Sampling: top-p, CTRL repetition penalty, the exponential race, and seeded reproducibility."""

from __future__ import annotations

import pytest
import torch

from llamafast.config import SamplingConfig
from llamafast.generate import Completion, Engine, fill_completion, generate
from llamafast.load import load_model
from llamafast.sampling import apply_openai_penalties, apply_repetition_penalty, sample, top_p_filter

PROBS = torch.tensor([0.05, 0.5, 0.15, 0.3])


@pytest.mark.parametrize(
    "p,kept",
    [(0.5, [1]), (0.8, [1, 3]), (0.81, [1, 2, 3]), (0.95, [1, 2, 3]), (0.96, [0, 1, 2, 3]), (1.0, [0, 1, 2, 3])],
)
def test_top_p_keeps_smallest_set_reaching_p(p, kept):
    out = top_p_filter(PROBS, p)
    assert torch.nonzero(out).flatten().tolist() == kept
    assert torch.equal(out[kept], PROBS[kept])


def test_repetition_penalty_divides_positive_and_multiplies_negative():
    logits = torch.tensor([2.0, -2.0, 1.0, -1.0])
    seen = torch.tensor([True, True, False, False])
    assert apply_repetition_penalty(logits, seen, 2.0).tolist() == [1.0, -4.0, 1.0, -1.0]


def test_greedy_and_top_k_1_agree():
    logits = torch.randn(512)
    seen = torch.zeros(512, dtype=torch.bool)
    greedy = sample(logits, seen, SamplingConfig(temperature=0))
    assert sample(logits, seen, SamplingConfig(temperature=1.0, top_k=1, top_p=1.0)) == greedy == logits.argmax()


@pytest.mark.parametrize("temperature", [1e-38, 1e-45, 1e-300])
def test_tiny_temperature_is_greedy_not_unk(temperature):
    """logits / 1e-38 overflowed to inf and softmax gave NaN: every draw was id 0. Now it is the argmax."""
    logits = torch.randn(512) * 5
    seen = torch.zeros(512, dtype=torch.bool)
    for _ in range(20):
        assert sample(logits, seen, SamplingConfig(temperature=temperature, top_p=0.9)) == logits.argmax()


def test_ids_past_the_tokenizer_are_never_sampled():
    """A model vocabulary padded past the tokenizer's pieces: the padding ids are never drawn, even when
    they have the highest logits, greedy or sampled."""
    logits = torch.zeros(512)
    logits[500:] = 100.0
    seen = torch.zeros(512, dtype=torch.bool)
    assert sample(logits, seen, SamplingConfig(temperature=0), n_vocab=500).item() < 500
    draws = [sample(logits, seen, SamplingConfig(temperature=1.0, top_p=1.0), n_vocab=500).item() for _ in range(200)]
    assert max(draws) < 500 and len(set(draws)) > 50


def test_draws_follow_the_distribution():
    """The exponential race samples from softmax(logits): 40k draws, each frequency within 0.01."""
    logits = PROBS.log()
    seen = torch.zeros(4, dtype=torch.bool)
    cfg = SamplingConfig(temperature=1.0, top_p=1.0)
    draws = torch.cat([sample(logits, seen, cfg) for _ in range(40_000)])
    freq = torch.bincount(draws, minlength=4).float() / len(draws)
    torch.testing.assert_close(freq, PROBS, atol=0.01, rtol=0)


def test_top_p_never_samples_outside_the_nucleus():
    logits = PROBS.log()
    cfg = SamplingConfig(temperature=1.0, top_p=0.8)
    draws = {int(sample(logits, torch.zeros(4, dtype=torch.bool), cfg)) for _ in range(2000)}
    assert draws == {1, 3}


@pytest.fixture(scope="module")
def stories():
    return load_model(None, device=torch.device("cpu"))


def _text(lm, seed: int, penalty: float = 1.0) -> list[int]:
    cfg = SamplingConfig(temperature=1.0, top_p=0.95, seed=seed, repetition_penalty=penalty)
    ids = lm.tokenizer.encode("Once upon a time")
    return generate(Engine(lm.model, cfg, 64), lm.tokenizer, ids, 48).token_ids


def test_same_seed_same_text(stories):
    assert _text(stories, 7) == _text(stories, 7)
    assert _text(stories, 7) != _text(stories, 8)


def test_repetition_penalty_reduces_repeats(stories):
    """Greedy stories260K repeats itself ("Lily was sad and didn't know what to do" twice in 200 tokens)."""
    lm = stories
    greedy = SamplingConfig(temperature=0)
    plain = generate(Engine(lm.model, greedy, 201), lm.tokenizer, [1], 200).token_ids
    greedy.repetition_penalty = 1.3
    penalised = generate(Engine(lm.model, greedy, 201), lm.tokenizer, [1], 200).token_ids
    assert len(set(penalised)) > len(set(plain))


def test_openai_penalties_subtract_per_count_and_per_presence():
    """OpenAI's formula: logit - count * frequency - (count > 0) * presence."""
    logits = torch.tensor([1.0, 1.0, 1.0])
    counts = torch.tensor([0, 1, 3], dtype=torch.int32)
    assert apply_openai_penalties(logits, counts, 0.5, 0.25).tolist() == [1.0, 0.25, -0.75]


def test_frequency_penalty_counts_sampled_tokens_only(stories):
    """The engine counts the tokens it samples (not the prompt's): a strong frequency penalty makes greedy
    stories260K stop repeating; the prompt's own tokens stay as likely as they were."""
    lm = stories
    prompt = lm.tokenizer.encode("Lily was sad. Lily was sad. Lily")
    plain = generate(Engine(lm.model, SamplingConfig(temperature=0), 160), lm.tokenizer, prompt, 120).token_ids
    cfg = SamplingConfig(temperature=0, frequency_penalty=2.0)
    penalised = generate(Engine(lm.model, cfg, 160), lm.tokenizer, prompt, 120).token_ids
    assert len(set(penalised)) > len(set(plain))
    assert penalised[0] == plain[0]  # nothing sampled yet: no penalty, even on the prompt's repeats


def test_logprobs_are_the_models_log_softmax(stories):
    """Each token's logprob and its top alternatives equal log_softmax of the model's logits at its position
    (one forward pass over the whole sequence), whatever the sampling (temperature, penalties)."""
    lm = stories
    engine = Engine(lm.model, SamplingConfig(), 64)
    engine.configure(SamplingConfig(temperature=0.8, top_p=0.9, seed=3, frequency_penalty=0.5), top_logprobs=5)
    prompt = lm.tokenizer.encode("Once upon a time")
    torch.manual_seed(3)
    out = Completion(prompt)
    fill_completion(engine, lm.tokenizer, out, 12)
    tokens = out.token_ids + ([lm.tokenizer.eos_id] if out.finish_reason == "eos" else [])
    assert len(out.logprobs) == len(tokens) == 12
    with torch.no_grad():
        logits = lm.model(torch.tensor(prompt + tokens), torch.zeros((), dtype=torch.long), all_logits=True)  # (S, V)
    want = torch.log_softmax(logits.float(), dim=-1)[len(prompt) - 1 : -1]  # the positions that sampled tokens
    for i, (token, got) in enumerate(zip(tokens, out.logprobs)):
        assert got.logprob == pytest.approx(want[i, token].item(), abs=1e-4)
        top = torch.topk(want[i], 5)
        assert [t for t, _ in got.top] == top.indices.tolist()
        assert [lp for _, lp in got.top] == pytest.approx(top.values.tolist(), abs=1e-4)


def test_engine_sampling_is_set_per_completion(stories):
    """configure() changes how the next completion samples on the same Engine: greedy there equals greedy on a
    fresh Engine, and logprobs off again record nothing."""
    lm = stories
    prompt = lm.tokenizer.encode("Once upon a time")
    engine = Engine(lm.model, SamplingConfig(temperature=1.0, seed=1), 64)
    generate(engine, lm.tokenizer, prompt, 10)
    engine.configure(SamplingConfig(temperature=0), top_logprobs=None)
    again = generate(engine, lm.tokenizer, prompt, 10)
    fresh = generate(Engine(lm.model, SamplingConfig(temperature=0), 64), lm.tokenizer, prompt, 10)
    assert again.token_ids == fresh.token_ids and again.logprobs == []


def test_decode_graphs_are_kept_per_sampling(stories, monkeypatch):
    """On CUDA a decode graph holds its sampling settings as constants: one graph per way of sampling (not per
    seed), the least recently used dropped past MAX_DECODE_GRAPHS. Checked with stand-in graphs on the CPU."""
    from llamafast import generate as gen

    captured = []

    class Graph:
        def replay(self):
            pass

    engine = Engine(stories.model, SamplingConfig(), 64)
    engine.mode = "graph"
    monkeypatch.setattr(engine, "_capture", lambda: captured.append(engine.graph_key()) or Graph())
    for seed in (1, 2):
        engine.configure(SamplingConfig(seed=seed))
        engine.decode()
    assert len(captured) == 1  # the seed is not baked in
    engine.configure(SamplingConfig(), top_logprobs=3)
    engine.decode()
    for t in range(gen.MAX_DECODE_GRAPHS):
        engine.configure(SamplingConfig(temperature=0.1 * (t + 1)))
        engine.decode()
    assert len(engine._graphs) == gen.MAX_DECODE_GRAPHS and len(captured) == 2 + gen.MAX_DECODE_GRAPHS
    assert engine.graph_key() in engine._graphs and captured[0] not in engine._graphs  # least recent gone
