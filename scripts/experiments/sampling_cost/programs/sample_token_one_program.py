"""The next token from the LM head's logits in one program: penalties, then greedy, or temperature, top-k, top-p
and a draw, which llamafast.sampling.sample does in a dozen torch kernels (a sort among them).

    l = logits[:n], CTRL's repetition penalty and OpenAI's frequency and presence penalties applied
    greedy:  argmax l (the first of equal maxima; the first NaN, as torch.argmax)
    else:    z = (l - max l) / T;  top-k: z of the tokens below the k-th largest set to -inf;
             token = argmax over the candidates of z + Gumbel noise: a draw from softmax(z);
             top-p: kept when the tokens more likely than it hold less than p of the mass, else it and every
             less likely token leave the candidates and the draw is made again

The k-th largest is found by radix selection over the order-preserving integers of the logits' bits (four
passes, each a 256-bin histogram of one byte among the tokens that share the bytes above it); the nucleus by
rejection, as FlashInfer's sorting-free samplers do, so nothing is sorted. A draw lands in the nucleus with
probability about p, and conditioned on landing there it is a draw from the nucleus renormalised: the tokens come
from the distribution the sort gives (a token tied with the nucleus's last one is kept with it, where a sort keeps
some of the tied ones). The noise is Philox's (tl.rand) at offsets made of a draw counter that each call advances
on the device, so a seed gives the same tokens on every run and a replayed CUDA graph new ones at each step.
One program walks the row in chunks (each lane keeping its own best and sums, the lanes meeting once a pass):
on an H200 (scripts/experiments/sampling_cost/fused/) a draw with temperature 0.6 and top-p 0.9 took 38.3 us at a
vocabulary of 32,000 and 53.7 at 49,152, against 107.2 and 114.5 for torch's kernels, greedy 7.0 and 8.5 against
10.6 and 13.8, but top-k (four histogram passes, each a reduction per chunk) 125.2 and 186.8 against 96.6 and 108.0,
so backends.fused_sample leaves top-k to torch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from llamafast.config import SamplingConfig

from ._common import check_vector, next_pow2

CHUNK = 4096  # logits a pass loads at a time, at most: 8 a thread at 16 warps
MAX_ROUNDS = 64  # top-p draws a call makes before it takes the most likely token (each miss removes a token)
STRIDE = 1 << 24  # noise offsets of one draw: room for a vocabulary of 16M
STAGES = 3  # chunks a pass has in flight (tl.range's software pipeline)


@triton.jit
def _logits(logits_ptr, seen_ptr, counts_ptr, c, n, repetition, frequency, presence,
            CHUNK: tl.constexpr, REPETITION: tl.constexpr, OPENAI: tl.constexpr):
    """One chunk of the penalised logits (-inf past n), and its indices."""
    i = c + tl.arange(0, CHUNK)
    valid = i < n
    l = tl.load(logits_ptr + i, mask=valid, other=float("-inf")).to(tl.float32)
    if REPETITION:
        seen = tl.load(seen_ptr + i, mask=valid, other=0) != 0
        l = tl.where(seen, tl.where(l > 0, l / repetition, l * repetition), l)
    if OPENAI:
        k = tl.load(counts_ptr + i, mask=valid, other=0).to(tl.float32)
        l = l - k * frequency - tl.where(k > 0, presence, 0.0)
    return l, i, valid


@triton.jit
def _key(l):
    """int32s ordered as the floats l are."""
    bits = l.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


@triton.jit
def _kth_key(logits_ptr, seen_ptr, counts_ptr, n, top_k, repetition, frequency, presence,
             CHUNK: tl.constexpr, REPETITION: tl.constexpr, OPENAI: tl.constexpr):
    """The k-th largest key among the first n: a byte a pass, from the top one."""
    prefix = tl.full((), 0, tl.int32)  # the bytes chosen so far, of keys offset to unsigned order
    above = tl.full((), 0, tl.int32)  # tokens whose key beats every key with that prefix
    bins = tl.arange(0, 256)
    for byte in tl.static_range(4):
        shift = 24 - 8 * byte
        hist = tl.zeros((256,), tl.int32)
        for c in range(0, n, CHUNK):
            l, i, valid = _logits(logits_ptr, seen_ptr, counts_ptr, c, n, repetition, frequency, presence, CHUNK,
                                  REPETITION, OPENAI)
            u = _key(l) ^ -2147483648
            same = valid
            if byte > 0:
                same = same & (((u ^ prefix) >> (shift + 8)) == 0)
            hist += tl.histogram((u >> shift) & 0xFF, 256, mask=same)
        at_least = tl.sum(hist, 0) - tl.cumsum(hist, 0) + hist  # tokens with this prefix and byte >= b
        b = tl.max(tl.where(above + at_least >= top_k, bins, -1), 0)
        above += tl.sum(tl.where(bins > b, hist, 0), 0)
        prefix = prefix | (b << shift)
    return prefix ^ -2147483648


@triton.jit
def _pass(logits_ptr, seen_ptr, counts_ptr, n, m, temperature, kth, pivot, seed, offset,
          repetition, frequency, presence,
          CHUNK: tl.constexpr, REPETITION: tl.constexpr, OPENAI: tl.constexpr, TOP_K: tl.constexpr,
          DRAW: tl.constexpr, STAGES: tl.constexpr):
    """Over the row: the mass of the tokens with z > pivot (DRAW False), or the winner of a Gumbel race among
    them (DRAW True: its index, its z and the whole row's mass). Each lane keeps its own sums and best through the
    chunks and the lanes meet once, at the end: the loop waits on nothing but its loads."""
    best = tl.full((CHUNK,), float("-inf"), tl.float32)
    at = tl.full((CHUNK,), 0, tl.int32)
    z_at = tl.full((CHUNK,), float("-inf"), tl.float32)
    mass = tl.zeros((CHUNK,), tl.float32)
    for c in tl.range(0, n, CHUNK, num_stages=STAGES):
        l, i, valid = _logits(logits_ptr, seen_ptr, counts_ptr, c, n, repetition, frequency, presence, CHUNK,
                              REPETITION, OPENAI)
        z = (l - m) / temperature
        if TOP_K:
            z = tl.where(_key(l) >= kth, z, float("-inf"))
        if DRAW:
            mass += tl.exp(z)
            u = tl.maximum(tl.rand(seed, offset + i), 1e-30)
            score = tl.where(z > pivot, z - tl.log(-tl.log(u)), float("-inf"))
            better = score > best  # a lane's earlier chunk keeps a tie
            best = tl.where(better, score, best)
            at = tl.where(better, i, at)
            z_at = tl.where(better, z, z_at)
        else:
            mass += tl.where(z > pivot, tl.exp(z), 0.0)
    top = tl.max(best, 0)
    token = tl.min(tl.where(best == top, at, 2147483647), 0)
    zt = tl.max(tl.where((best == top) & (at == token), z_at, float("-inf")), 0)
    return token, zt, tl.sum(mass, 0)


@triton.jit
def _sample_kernel(
    logits_ptr, seen_ptr, counts_ptr, draw_ptr, out_ptr,  # draw (2,) int64: the seed, the calls so far
    n, temperature, top_k, top_p, repetition, frequency, presence,
    CHUNK: tl.constexpr, GREEDY: tl.constexpr, REPETITION: tl.constexpr, OPENAI: tl.constexpr,
    TOP_K: tl.constexpr, TOP_P: tl.constexpr, ROUNDS: tl.constexpr, STRIDE: tl.constexpr,
    STAGES: tl.constexpr,
):
    step = tl.load(draw_ptr + 1)
    best = tl.full((CHUNK,), float("-inf"), tl.float32)  # each lane's largest logit, its index, its first NaN
    at = tl.full((CHUNK,), 0, tl.int32)
    nan_at = tl.full((CHUNK,), 2147483647, tl.int32)
    for c in tl.range(0, n, CHUNK, num_stages=STAGES):
        l, i, valid = _logits(logits_ptr, seen_ptr, counts_ptr, c, n, repetition, frequency, presence, CHUNK,
                              REPETITION, OPENAI)
        better = l > best  # a lane's earlier chunk keeps a tie
        best = tl.where(better, l, best)
        at = tl.where(better, i, at)
        nan_at = tl.minimum(nan_at, tl.where(l != l, i, 2147483647))
    m = tl.max(best, 0)
    token = tl.min(tl.where(best == m, at, 2147483647), 0)  # the first of equal maxima
    first_nan = tl.min(nan_at, 0)
    if GREEDY:
        token = tl.where(first_nan < n, first_nan, token)
    else:
        likeliest = token
        kth = tl.full((), 0, tl.int32)
        if TOP_K:
            kth = _kth_key(logits_ptr, seen_ptr, counts_ptr, n, top_k, repetition, frequency, presence, CHUNK,
                           REPETITION, OPENAI)
        seed = tl.load(draw_ptr)
        offset = step * ROUNDS * STRIDE
        pivot = tl.full((), float("-inf"), tl.float32)
        token, zt, total = _pass(logits_ptr, seen_ptr, counts_ptr, n, m, temperature, kth, pivot, seed, offset,
                                 repetition, frequency, presence, CHUNK, REPETITION, OPENAI, TOP_K, True, STAGES)
        if TOP_P:
            _, _, above = _pass(logits_ptr, seen_ptr, counts_ptr, n, m, temperature, kth, zt, seed, offset,
                                repetition, frequency, presence, CHUNK, REPETITION, OPENAI, TOP_K, False, STAGES)
            r = tl.full((), 1, tl.int32)
            while (above >= top_p * total) & (r < ROUNDS):  # outside the nucleus: draw among the likelier
                token, zt, _ = _pass(logits_ptr, seen_ptr, counts_ptr, n, m, temperature, kth, zt, seed,
                                     offset + r * STRIDE, repetition, frequency, presence, CHUNK, REPETITION,
                                     OPENAI, TOP_K, True, STAGES)
                _, _, above = _pass(logits_ptr, seen_ptr, counts_ptr, n, m, temperature, kth, zt, seed, offset,
                                    repetition, frequency, presence, CHUNK, REPETITION, OPENAI, TOP_K, False,
                                    STAGES)
                r += 1
            if above >= top_p * total:  # out of rounds: the most likely token is always in the nucleus
                token = likeliest
    tl.store(out_ptr, token.to(tl.int64))
    tl.store(draw_ptr + 1, step + 1)


def sample_token(logits: torch.Tensor, seen: torch.Tensor, counts: torch.Tensor, draw: torch.Tensor,
                 cfg: SamplingConfig, n_vocab: int | None = None) -> torch.Tensor:
    """The next token (1,) int64 from logits (V,), as llamafast.reference.sample_token draws it, and draw's counter
    advanced. seen (V,) bool and counts (V,) int32 feed the penalties; only ids below n_vocab are drawn."""
    v = logits.numel()
    n = v if n_vocab is None else min(n_vocab, v)
    assert 1 <= n <= STRIDE, f"{n} ids: from 1 to {STRIDE}"
    check_vector("seen", seen, v)
    check_vector("counts", counts, v)
    assert draw.dtype == torch.int64 and draw.numel() == 2, "draw: (2,) int64, the seed and the calls so far"
    out = torch.empty(1, dtype=torch.int64, device=logits.device)
    t = cfg.temperature
    sampled = t != 0
    chunk = max(16, min(CHUNK, next_pow2(n)))
    _sample_kernel[(1,)](
        logits, seen, counts, draw, out, n, max(t, torch.finfo(torch.float32).tiny), min(cfg.top_k, n), cfg.top_p,
        cfg.repetition_penalty, cfg.frequency_penalty, cfg.presence_penalty, CHUNK=chunk, GREEDY=not sampled,
        REPETITION=cfg.repetition_penalty != 1.0, OPENAI=cfg.frequency_penalty != 0 or cfg.presence_penalty != 0,
        TOP_K=sampled and cfg.top_k > 0, TOP_P=sampled and cfg.top_p < 1.0, ROUNDS=MAX_ROUNDS, STRIDE=STRIDE,
        STAGES=STAGES,
        num_warps=max(1, chunk // 256),
    )
    return out
