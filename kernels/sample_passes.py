"""The sampler's passes over the row of logits (sample_token.py, sample_nucleus.py): the penalised logits of a chunk,
the k-th largest key by radix selection, one pass of the nucleus test or of a Gumbel race among the tokens above a
pivot, and the rounds of draws a missed nucleus test takes, which the program that finishes a draw walks alone."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def chunk_logits(logits_ptr, seen_ptr, counts_ptr, c, n, repetition, frequency, presence,
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
def order_key(l):
    """int32s ordered as the floats l are."""
    bits = l.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


@triton.jit
def kth_key(logits_ptr, seen_ptr, counts_ptr, n, top_k, repetition, frequency, presence,
             CHUNK: tl.constexpr, REPETITION: tl.constexpr, OPENAI: tl.constexpr):
    """The k-th largest key among the first n: a byte a pass, from the top one."""
    prefix = tl.full((), 0, tl.int32)  # the bytes chosen so far, of keys offset to unsigned order
    above = tl.full((), 0, tl.int32)  # tokens whose key beats every key with that prefix
    bins = tl.arange(0, 256)
    for byte in tl.static_range(4):
        shift = 24 - 8 * byte
        hist = tl.zeros((256,), tl.int32)
        for c in range(0, n, CHUNK):
            l, i, valid = chunk_logits(logits_ptr, seen_ptr, counts_ptr, c, n, repetition, frequency, presence, CHUNK,
                                       REPETITION, OPENAI)
            u = order_key(l) ^ -2147483648
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
def row_pass(logits_ptr, seen_ptr, counts_ptr, lo, n, m, temperature, kth, pivot, seed, offset,
          repetition, frequency, presence,
          CHUNK: tl.constexpr, REPETITION: tl.constexpr, OPENAI: tl.constexpr, TOP_K: tl.constexpr,
          DRAW: tl.constexpr, STAGES: tl.constexpr):
    """Over the row's ids [lo, n): the mass of the tokens with z > pivot (DRAW False), or the winner of a Gumbel
    race among them (DRAW True: its index, its z and the whole row's mass). Each lane keeps its own sums and best
    through the chunks and the lanes meet once, at the end: the loop waits on nothing but its loads."""
    best = tl.full((CHUNK,), float("-inf"), tl.float32)
    at = tl.full((CHUNK,), 0, tl.int32)
    z_at = tl.full((CHUNK,), float("-inf"), tl.float32)
    mass = tl.zeros((CHUNK,), tl.float32)
    for c in tl.range(lo, n, CHUNK, num_stages=STAGES):
        l, i, valid = chunk_logits(logits_ptr, seen_ptr, counts_ptr, c, n, repetition, frequency, presence, CHUNK,
                                   REPETITION, OPENAI)
        z = (l - m) / temperature
        if TOP_K:
            z = tl.where(order_key(l) >= kth, z, float("-inf"))
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
def redraws(logits_ptr, seen_ptr, counts_ptr, n, m, temperature, kth, zt, above, total, top_p, token, likeliest,
            seed, offset, repetition, frequency, presence, CHUNK: tl.constexpr, REPETITION: tl.constexpr,
            OPENAI: tl.constexpr, TOP_K: tl.constexpr, ROUNDS: tl.constexpr, STRIDE: tl.constexpr,
            STAGES: tl.constexpr):
    """The drawn token, kept where the tokens more likely than it (z > zt) hold less than top_p of the mass, else
    drawn again among those, round after round, by this program alone (about one call in ten at p = 0.9); out of
    rounds, the most likely token, which is always in the nucleus."""
    r = tl.full((), 1, tl.int32)
    while (above >= top_p * total) & (r < ROUNDS):
        token, zt, _ = row_pass(logits_ptr, seen_ptr, counts_ptr, 0, n, m, temperature, kth, zt, seed,
                                offset + r * STRIDE, repetition, frequency, presence, CHUNK, REPETITION, OPENAI,
                                TOP_K, True, STAGES)
        _, _, above = row_pass(logits_ptr, seen_ptr, counts_ptr, 0, n, m, temperature, kth, zt, seed, offset,
                               repetition, frequency, presence, CHUNK, REPETITION, OPENAI, TOP_K, False, STAGES)
        r += 1
    if above >= top_p * total:
        token = likeliest
    return token
