"""Sampling on the device without a host synchronisation: the next token never leaves the GPU.

Penalties first (CTRL's repetition penalty, OpenAI's frequency and presence penalties), then greedy at
temperature 0; otherwise temperature, top-k, top-p, then a draw by the exponential race (argmax of p / Exp(1),
the gpt-fast trick), which needs no sync unlike multinomial.
"""

from __future__ import annotations

import torch

from llamafast.config import SamplingConfig


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL (Keskar et al. 2019): divide positive logits of seen tokens by the penalty, multiply negative ones."""
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalised, logits)


def apply_openai_penalties(logits: torch.Tensor, counts: torch.Tensor, frequency: float, presence: float):
    """OpenAI's: logit - count * frequency - (count > 0) * presence, counts (V,) of the tokens sampled so far."""
    c = counts.to(logits.dtype)
    return logits - c * frequency - (c > 0).to(logits.dtype) * presence


def top_p_filter(probs: torch.Tensor, p: float) -> torch.Tensor:
    """Keeps the smallest set of most likely tokens whose probability reaches p; zeroes the rest."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    sorted_probs = sorted_probs.masked_fill(mass_before >= p, 0.0)
    return torch.zeros_like(probs).scatter(-1, order, sorted_probs)


def sample(logits: torch.Tensor, seen: torch.Tensor, cfg: SamplingConfig, n_vocab: int | None = None,
           counts: torch.Tensor | None = None) -> torch.Tensor:
    """logits (V,) fp32, seen (V,) bool -> token (1,) int64, on the logits' device. With n_vocab, only ids below
    it are drawn: a model whose vocabulary is padded past its tokenizer's pieces never yields an id that the
    tokenizer cannot decode. counts (V,): how often each token was sampled, for the frequency and presence
    penalties (needed only when one is set)."""
    if n_vocab is not None:
        logits, seen = logits[:n_vocab], seen[:n_vocab]
    if cfg.repetition_penalty != 1.0:
        logits = apply_repetition_penalty(logits, seen, cfg.repetition_penalty)
    if uses_counts(cfg):
        logits = apply_openai_penalties(logits, counts[: logits.shape[0]], cfg.frequency_penalty, cfg.presence_penalty)
    if cfg.temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    # Shifted by the maximum before dividing, so that a tiny temperature (1e-38) gives 0 for the best token and
    # -inf for the rest (a greedy draw) instead of inf - inf = NaN everywhere; below fp32's smallest normal it
    # is that normal (1e-300 would round to 0 and give 0 / 0).
    logits = (logits - logits.max()) / max(cfg.temperature, torch.finfo(logits.dtype).tiny)
    if cfg.top_k:
        kth = torch.topk(logits, min(cfg.top_k, logits.shape[-1])).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if cfg.top_p < 1.0:
        probs = top_p_filter(probs, cfg.top_p)
    race = torch.empty_like(probs).exponential_(1.0).clamp_min_(1e-20)  # a 0 draw would make 0/0 = NaN win
    return (probs / race).argmax(dim=-1, keepdim=True)


def uses_counts(cfg: SamplingConfig) -> bool:
    """Whether sampling with cfg reads the counts of the tokens sampled so far."""
    return cfg.frequency_penalty != 0 or cfg.presence_penalty != 0
