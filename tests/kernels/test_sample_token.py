"""kernels/sample_token.py against the torch sampler (reference.sample_token): the same greedy token, penalties,
ties, NaN and a vocabulary cut short included, across chunk boundaries; draws that follow the distribution the
sort-based filters give, never leave the top-k and the nucleus, and repeat for the same seed and counter."""

from __future__ import annotations

import importlib

import pytest
import torch

from llamafast import reference
from llamafast.config import SamplingConfig
from llamafast.kernels.sample_token import CHUNK, sample_token
from llamafast.sampling import apply_repetition_penalty

from .common import DEVICE, ON_GPU

GREEDY_SIZES = [37, CHUNK + 904, *[pytest.param(v, marks=pytest.mark.gpu) for v in (32000, 49152)]]


def _inputs(v: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(v, generator=gen) * 3
    seen = torch.rand(v, generator=gen) < 0.2
    counts = torch.randint(0, 3, (v,), generator=gen, dtype=torch.int32)
    return logits, seen, counts


def _draw(seed: int = 5, calls: int = 0) -> torch.Tensor:
    return torch.tensor([seed, calls], dtype=torch.int64, device=DEVICE)


def _fused(logits, seen, counts, cfg, n_vocab=None, draw=None) -> int:
    draw = _draw() if draw is None else draw
    return int(sample_token(logits.to(DEVICE), seen.to(DEVICE), counts.to(DEVICE), draw, cfg, n_vocab))


@pytest.mark.parametrize("v", GREEDY_SIZES)
@pytest.mark.parametrize("penalties", [{}, {"repetition_penalty": 1.3, "frequency_penalty": 0.4,
                                           "presence_penalty": 0.2}], ids=["plain", "penalised"])
@pytest.mark.parametrize("n_vocab", [None, 30])
def test_greedy_equals_the_reference(v, penalties, n_vocab):
    logits, seen, counts = _inputs(v)
    logits[v - 3] = 50.0  # the winner, in the last chunk
    logits[n_vocab - 1 if n_vocab else 1] = 50.0  # tied with an earlier one: the first wins
    cfg = SamplingConfig(temperature=0, **penalties)
    want = reference.sample_token(logits, seen, counts, None, cfg, n_vocab)
    assert _fused(logits, seen, counts, cfg, n_vocab) == int(want)


def test_greedy_takes_the_first_nan_as_torch_does():
    logits, seen, counts = _inputs(CHUNK + 10)
    logits[CHUNK + 5] = logits[CHUNK + 7] = float("nan")
    logits[3] = 100.0
    cfg = SamplingConfig(temperature=0)
    assert _fused(logits, seen, counts, cfg) == int(logits.argmax()) == CHUNK + 5


@pytest.mark.parametrize("cfg", [SamplingConfig(temperature=1e-38), SamplingConfig(temperature=1.0, top_k=1)],
                         ids=["tiny-temperature", "top-k-1"])
def test_degenerate_draws_are_greedy(cfg):
    logits, seen, counts = _inputs(CHUNK + 100)
    want = int(logits.argmax())
    assert {_fused(logits, seen, counts, cfg, draw=_draw(s)) for s in range(5)} == {want}


def _allowed(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Each token's probability under the filters, a token tied with the nucleus's last one kept with it."""
    z = logits / cfg.temperature
    if cfg.top_k:
        z = z.masked_fill(z < torch.topk(z, cfg.top_k).values[-1], float("-inf"))
    p = torch.softmax(z, 0)
    if cfg.top_p < 1:
        above = torch.stack([p[p > q].sum() for q in p])
        p = torch.where(above < cfg.top_p, p, 0.0)
    return p / p.sum()


def _frequencies(logits, cfg, draws: int) -> torch.Tensor:
    seen, counts = torch.zeros(logits.numel(), dtype=torch.bool), torch.zeros(logits.numel(), dtype=torch.int32)
    draw = _draw()
    args = (logits.to(DEVICE), seen.to(DEVICE), counts.to(DEVICE), draw, cfg)
    tokens = torch.cat([sample_token(*args) for _ in range(draws)]).cpu()
    assert int(draw[1]) == draws  # each call advanced the counter once
    return torch.bincount(tokens, minlength=logits.numel()).float() / draws


LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.5, -1.0, 3.0])  # 0.5 twice: a tie at the edge of top-4 and of the nucleus
WAYS = [
    pytest.param(SamplingConfig(temperature=1.5, top_k=4, top_p=0.9), id="top-k-and-top-p"),
    pytest.param(SamplingConfig(temperature=1.0, top_p=0.8), id="top-p"),
    pytest.param(SamplingConfig(temperature=1.0, top_p=1.0), id="no-filter", marks=pytest.mark.gpu),
    pytest.param(SamplingConfig(temperature=0.7, top_k=3, top_p=1.0), id="top-k", marks=pytest.mark.gpu),
]


@pytest.mark.parametrize("cfg", WAYS)
def test_draws_follow_the_distribution(cfg):
    """Each token's frequency within five standard deviations of its probability (800 draws on the CPU, 20,000
    on a GPU)."""
    draws = 20_000 if ON_GPU else 800
    got, want = _frequencies(LOGITS, cfg, draws), _allowed(LOGITS, cfg)
    assert torch.all((got - want).abs() <= 5 * (want * (1 - want) / draws).sqrt() + 1e-9), (got, want)


@pytest.mark.parametrize("cfg", [SamplingConfig(temperature=0.8, top_k=10, top_p=1.0),
                                 SamplingConfig(temperature=0.6, top_p=0.5),
                                 SamplingConfig(temperature=2.0, top_k=40, top_p=0.7, repetition_penalty=1.2)],
                         ids=["top-k", "top-p", "both-penalised"])
def test_draws_stay_inside_the_filters(cfg):
    logits, seen, counts = _inputs(CHUNK + 300, seed=1)
    logits[7] = logits[CHUNK + 9]  # a tie across chunks
    penalised = apply_repetition_penalty(logits, seen, cfg.repetition_penalty)
    allowed = _allowed(penalised, cfg) > 0
    tokens = {_fused(logits, seen, counts, cfg, draw=_draw(s)) for s in range(40)}
    assert len(tokens) > 1 and all(allowed[t] for t in tokens)


def test_programs_share_the_row(monkeypatch):
    """A row over several programs (chunks of 64 here, 4,096 in use): greedy's first maximum and first NaN across
    their shares, and draws that follow the distribution with the likely tokens in different programs' shares,
    every other token far below them."""
    module = importlib.import_module("llamafast.kernels.sample_token")  # the package's name is the function's
    monkeypatch.setattr(module, "CHUNK", 64)
    v = 3 * 64 + 17
    logits, seen, counts = _inputs(v, seed=4)
    logits[150] = logits[70] = 50.0  # tied maxima in two programs' shares: the first wins
    cfg = SamplingConfig(temperature=0)
    assert _fused(logits, seen, counts, cfg) == int(reference.sample_token(logits, seen, counts, None, cfg)) == 70
    logits[v - 2] = logits[130] = float("nan")
    assert _fused(logits, seen, counts, cfg) == 130
    where = [3, 70, 71, 140, 150, v - 1]
    logits = torch.full((v,), -1e4)
    logits[where] = LOGITS
    cfg = SamplingConfig(temperature=1.0, top_p=0.8)
    draws = 20_000 if ON_GPU else 400
    got = _frequencies(logits, cfg, draws)
    want = _allowed(LOGITS, cfg)
    assert float(got[where].sum()) == 1.0
    assert torch.all((got[where] - want).abs() <= 5 * (want * (1 - want) / draws).sqrt() + 1e-9), (got[where], want)


def test_the_nucleus_test_over_the_programs_draws_what_one_program_draws(monkeypatch):
    """Top-p over several programs' shares (sample_nucleus.py's launch) against the whole row in one program: the
    first race and every later round draw the same noise, and only the order of the mass's sums differs, so each
    seed gives the same token; at p = 0.3 most first draws miss the nucleus and take more rounds."""
    module = importlib.import_module("llamafast.kernels.sample_token")
    v = 5 * 64 + 9
    logits, seen, counts = _inputs(v, seed=6)
    cfg = SamplingConfig(temperature=0.9, top_p=0.3, repetition_penalty=1.1)
    whole = [_fused(logits, seen, counts, cfg, draw=_draw(s)) for s in range(24)]
    monkeypatch.setattr(module, "CHUNK", 64)
    assert [_fused(logits, seen, counts, cfg, draw=_draw(s)) for s in range(24)] == whole
    assert len(set(whole)) > 1


def test_a_seed_and_counter_give_the_same_token_and_others_differ():
    logits, seen, counts = _inputs(500, seed=2)
    cfg = SamplingConfig(temperature=1.0, top_p=1.0)
    same = {_fused(logits / 10, seen, counts, cfg, draw=_draw(9, 3)) for _ in range(3)}
    assert len(same) == 1
    assert len({_fused(logits / 10, seen, counts, cfg, draw=_draw(9, c)) for c in range(20)}) > 5


@pytest.mark.parametrize("cfg, fused", [(SamplingConfig(), True), (SamplingConfig(repetition_penalty=1.1), True),
                                        (SamplingConfig(temperature=0), True), (SamplingConfig(top_k=40), False),
                                        (SamplingConfig(temperature=1.0, top_p=1.0), True),
                                        (SamplingConfig(temperature=0, top_k=40), True)],
                         ids=["default", "penalised", "greedy", "top-k", "no-filter", "greedy-top-k"])
def test_the_triton_backends_leave_top_k_to_torch(cfg, fused):
    from llamafast.backends import fused_sample

    logits, seen, counts = _inputs(300, seed=3)
    draw = _draw()
    fused_sample(logits.to(DEVICE), seen.to(DEVICE), counts.to(DEVICE), draw, cfg)
    assert int(draw[1]) == int(fused)  # the kernel advances the counter; torch's kernels leave it
