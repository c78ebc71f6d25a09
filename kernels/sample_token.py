"""The next token from the LM head's logits in one kernel: penalties, then greedy, or temperature, top-k, top-p and
a draw, which llamafast.sampling.sample does in a dozen torch kernels (a sort among them).

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
A program per CHUNK logits takes the first pass over its share (the largest logit, its first index, the first NaN,
and when drawing its candidates' mass and the first race among them); the last program to finish (a ticket)
combines the shares. For top-p, a second launch (sample_nucleus.py) tests the drawn token against the nucleus over
the same shares and its last program takes any further rounds alone. Top-k keeps one program for the row, whose
selection needs all of it first, and tests the nucleus in it. On an H100
(scripts/experiments/sampling_cost/programs/h100/), alone, at a vocabulary of 32,000 (49,152): temperature 0.6
with top-p 0.9 17.8 us (20.9) against 37.9 (53.9) when one program walked the whole row and 107.4 (114.6) for
torch's kernels (with the nucleus test's own launch, 16.8 (18.1) against 17.2 (20.7) in another process:
sampling_cost/nucleus/h100/), no filter 10.3 (10.6) against 28.5 (40.9), greedy 6.0 (6.1) against 7.0 (8.4); top-k (four
histogram passes, each a reduction per chunk) 127.3 (189.3) against torch's 98.5 (110.4), so
backends.fused_sample leaves top-k to torch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from llamafast.config import SamplingConfig

from ._common import cdiv, check_vector, next_pow2
from .decode_attention import tickets
from .sample_nucleus import STATE, nucleus
from .sample_passes import chunk_logits, kth_key, order_key, redraws, row_pass

CHUNK = 4096  # logits a pass loads at a time, at most: 8 a thread at 16 warps
MAX_ROUNDS = 64  # top-p draws a call makes before it takes the most likely token (each miss removes a token)
STRIDE = 1 << 24  # noise offsets of one draw: room for a vocabulary of 16M
STAGES = 3  # chunks a pass has in flight (tl.range's software pipeline)


@triton.jit
def _scan(logits_ptr, seen_ptr, counts_ptr, lo, hi, temperature, kth, seed, offset, repetition, frequency, presence,
          CHUNK: tl.constexpr, REPETITION: tl.constexpr, OPENAI: tl.constexpr, TOP_K: tl.constexpr,
          SAMPLED: tl.constexpr, STAGES: tl.constexpr):
    """One program's share [lo, hi) of the row in one pass, reduced to what the last program combines: its largest
    logit, the first index holding it and its first NaN; when SAMPLED, also its candidates' mass exp(l / T) as
    (max, sum relative to it), and the winner of its Gumbel race: argmax of l + T * g, the race of l / T + g
    scaled by T, whose terms cannot overflow however small T is (the winner's index and logit)."""
    best = tl.full((CHUNK,), float("-inf"), tl.float32)
    at = tl.full((CHUNK,), 0, tl.int32)
    nan_at = tl.full((CHUNK,), 2147483647, tl.int32)
    mx = tl.full((CHUNK,), float("-inf"), tl.float32)
    mass = tl.zeros((CHUNK,), tl.float32)
    race = tl.full((CHUNK,), float("-inf"), tl.float32)
    race_at = tl.full((CHUNK,), 2147483647, tl.int32)
    race_l = tl.full((CHUNK,), float("-inf"), tl.float32)
    for c in tl.range(lo, hi, CHUNK, num_stages=STAGES):
        l, i, valid = chunk_logits(logits_ptr, seen_ptr, counts_ptr, c, hi, repetition, frequency, presence, CHUNK,
                                   REPETITION, OPENAI)
        better = l > best  # a lane's earlier chunk keeps a tie
        best = tl.where(better, l, best)
        at = tl.where(better, i, at)
        nan_at = tl.minimum(nan_at, tl.where(l != l, i, 2147483647))
        if SAMPLED:
            if TOP_K:
                l = tl.where(order_key(l) >= kth, l, float("-inf"))
            top = tl.maximum(mx, l)
            mass = mass * tl.exp(tl.where(mx == top, 0.0, mx - top) / temperature)
            mass += tl.where(l == float("-inf"), 0.0, tl.exp((l - top) / temperature))
            mx = top
            u = tl.maximum(tl.rand(seed, offset + i), 1e-30)
            score = tl.where(l > float("-inf"), l - temperature * tl.log(-tl.log(u)), float("-inf"))
            won = score > race
            race = tl.where(won, score, race)
            race_at = tl.where(won, i, race_at)
            race_l = tl.where(won, l, race_l)
    m = tl.max(best, 0)
    token = tl.min(tl.where(best == m, at, 2147483647), 0)  # the first of equal maxima
    pm = tl.max(mx, 0)
    ps = tl.sum(tl.where(mx == float("-inf"), 0.0, mass * tl.exp((mx - pm) / temperature)), 0)
    rs = tl.max(race, 0)
    rat = tl.min(tl.where(race == rs, race_at, 2147483647), 0)
    rl = tl.max(tl.where((race == rs) & (race_at == rat), race_l, float("-inf")), 0)
    return m, token, tl.min(nan_at, 0), pm, ps, rs, rat, rl


@triton.jit
def _sample_kernel(
    logits_ptr, seen_ptr, counts_ptr, draw_ptr, out_ptr,  # draw (2,) int64: the seed, the calls so far
    part_ptr, ticket_ptr,  # part (PROGRAMS, 8) fp32: each program's _scan; ticket: int32, zero between calls
    n, span, temperature, top_k, top_p, repetition, frequency, presence,
    CHUNK: tl.constexpr, GREEDY: tl.constexpr, REPETITION: tl.constexpr, OPENAI: tl.constexpr,
    TOP_K: tl.constexpr, TOP_P: tl.constexpr, ROUNDS: tl.constexpr, STRIDE: tl.constexpr,
    STAGES: tl.constexpr, PROGRAMS: tl.constexpr, BLOCK_P: tl.constexpr, SPLIT_P: tl.constexpr,
):
    pid = tl.program_id(0)
    step = tl.load(draw_ptr + 1)
    offset = step * ROUNDS * STRIDE
    seed = tl.load(draw_ptr) if not GREEDY else step
    kth = tl.full((), 0, tl.int32)
    if TOP_K:  # the selection walks the whole row: sample_token launches one program for it
        kth = kth_key(logits_ptr, seen_ptr, counts_ptr, n, top_k, repetition, frequency, presence, CHUNK,
                      REPETITION, OPENAI)
    lo = pid * span
    parts = _scan(logits_ptr, seen_ptr, counts_ptr, lo, tl.minimum(lo + span, n), temperature, kth, seed, offset,
                  repetition, frequency, presence, CHUNK, REPETITION, OPENAI, TOP_K, not GREEDY, STAGES)
    for j in tl.static_range(8):
        tl.store(part_ptr + pid * 8 + j, parts[j].to(tl.float32))
    tl.debug_barrier()  # every thread's partials stored before the ticket releases them
    ticket = tl.atomic_add(ticket_ptr, 1, sem="acq_rel", scope="gpu")
    if ticket == PROGRAMS - 1:  # the last program to finish combines the shares and draws
        tl.atomic_xchg(ticket_ptr, 0, sem="relaxed", scope="gpu")  # zero again for the next call
        token = _finish(logits_ptr, seen_ptr, counts_ptr, part_ptr, n, temperature, kth, top_p, seed, offset,
                        repetition, frequency, presence, CHUNK, GREEDY, REPETITION, OPENAI, TOP_K, TOP_P, ROUNDS,
                        STRIDE, STAGES, PROGRAMS, BLOCK_P, SPLIT_P)
        tl.store(out_ptr, token.to(tl.int64))
        tl.store(draw_ptr + 1, step + 1)


@triton.jit
def _finish(logits_ptr, seen_ptr, counts_ptr, part_ptr, n, temperature, kth, top_p, seed, offset,
            repetition, frequency, presence, CHUNK: tl.constexpr, GREEDY: tl.constexpr, REPETITION: tl.constexpr,
            OPENAI: tl.constexpr, TOP_K: tl.constexpr, TOP_P: tl.constexpr, ROUNDS: tl.constexpr,
            STRIDE: tl.constexpr, STAGES: tl.constexpr, PROGRAMS: tl.constexpr, BLOCK_P: tl.constexpr,
            SPLIT_P: tl.constexpr):
    """The token from the programs' shares (indices ride in fp32, exact below 2^24 = STRIDE): greedy's argmax or
    first NaN, or the race's winner, which top-p keeps when the tokens more likely than it hold less than p of the
    mass, else draws again among the likelier (redraws). SPLIT_P: the nucleus test is sample_nucleus.py's, which
    finds here what it needs (the row's max, its mass, the winner's z, the likeliest token) after the shares."""
    p = tl.arange(0, BLOCK_P)
    live = p < PROGRAMS
    big = 3.0e38
    best = tl.load(part_ptr + p * 8, mask=live, other=float("-inf"))
    m = tl.max(best, 0)
    token = tl.min(tl.where(best == m, tl.load(part_ptr + p * 8 + 1, mask=live, other=big), big), 0).to(tl.int32)
    if GREEDY:
        first_nan = tl.min(tl.load(part_ptr + p * 8 + 2, mask=live, other=big), 0)
        token = tl.where(first_nan < n, tl.minimum(first_nan, n).to(tl.int32), token)
    else:
        likeliest = token
        pm = tl.load(part_ptr + p * 8 + 3, mask=live, other=float("-inf"))
        ps = tl.load(part_ptr + p * 8 + 4, mask=live, other=0.0)
        total = tl.sum(tl.where(pm == float("-inf"), 0.0, ps * tl.exp((pm - m) / temperature)), 0)
        rs = tl.load(part_ptr + p * 8 + 5, mask=live, other=float("-inf"))
        rat = tl.load(part_ptr + p * 8 + 6, mask=live, other=big)
        top = tl.max(rs, 0)
        at = tl.min(tl.where(rs == top, rat, big), 0)
        rl = tl.max(tl.where((rs == top) & (rat == at), tl.load(part_ptr + p * 8 + 7, mask=live, other=0.0),
                             float("-inf")), 0)
        token = at.to(tl.int32)
        if TOP_P:
            zt = (rl - m) / temperature
            if SPLIT_P:
                state = part_ptr + PROGRAMS * 8  # STATE values: sample_nucleus.py reads them
                tl.store(state, m)
                tl.store(state + 1, total)
                tl.store(state + 2, zt)
                tl.store(state + 3, likeliest.to(tl.float32))
            else:
                _, _, above = row_pass(logits_ptr, seen_ptr, counts_ptr, 0, n, m, temperature, kth, zt, seed,
                                       offset, repetition, frequency, presence, CHUNK, REPETITION, OPENAI, TOP_K,
                                       False, STAGES)
                token = redraws(logits_ptr, seen_ptr, counts_ptr, n, m, temperature, kth, zt, above, total, top_p,
                                token, likeliest, seed, offset, repetition, frequency, presence, CHUNK, REPETITION,
                                OPENAI, TOP_K, ROUNDS, STRIDE, STAGES)
    return token


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
    top_k = sampled and cfg.top_k > 0
    chunk = max(16, min(CHUNK, next_pow2(n)))
    span = n if top_k else chunk  # top-k's selection walks the whole row in one program
    programs = cdiv(n, span)
    part = torch.empty(programs * 8 + STATE, dtype=torch.float32, device=logits.device)
    top_p = sampled and cfg.top_p < 1.0
    split_p = top_p and programs > 1  # the nucleus test over the programs' shares: a second launch
    temperature, penalties = max(t, torch.finfo(torch.float32).tiny), (
        cfg.repetition_penalty, cfg.frequency_penalty, cfg.presence_penalty)
    flags = dict(CHUNK=chunk, REPETITION=cfg.repetition_penalty != 1.0,
                 OPENAI=cfg.frequency_penalty != 0 or cfg.presence_penalty != 0, ROUNDS=MAX_ROUNDS, STRIDE=STRIDE,
                 STAGES=STAGES, PROGRAMS=programs, BLOCK_P=next_pow2(programs), num_warps=max(1, chunk // 256))
    _sample_kernel[(programs,)](
        logits, seen, counts, draw, out, part, tickets(logits.device, 1), n, span, temperature, min(cfg.top_k, n),
        cfg.top_p, *penalties, GREEDY=not sampled, TOP_K=top_k, TOP_P=top_p, SPLIT_P=split_p, **flags,
    )
    if split_p:
        nucleus(logits, seen, counts, draw, out, part, n, span, temperature, cfg.top_p, penalties, flags)
    return out
