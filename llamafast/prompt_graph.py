"""Prompt chunks replayed from CUDA graphs, one per prompt-length bucket, so the host cannot slow a prefill down.
A 7B prompt pass queues 257 launches: on the H100 the host took 8.8 ms to queue 512 tokens the GPU ran in about
13.6 (kernels/prefill/launcher.py), and a slower host took 16.5 ms at 512. A replay is one launch.

A chunk of n tokens is padded to bucket(n), after the real tokens, so causal attention hides the padding from
them. Its keys and values land in cache positions past the prompt, which the next decode step or chunk writes
before anything reads them (a step at position p writes p, then reads 0..p); a chunk whose padding would run past
the cache runs eagerly (the cache is not grown for it: attention splits by the cache's length). The logits come
from the last real row, chosen on the device (Transformer.forward's `last`).

A bucket's first chunk runs eagerly and unpadded, so a one-shot `generate` pays neither padding nor a capture;
its second runs eagerly padded (compiling that length's kernels, the warm-up a capture needs) and is captured;
later ones replay. The graphs share one memory pool: they never run at once, and each replay's logits are
copied out before the next. Under tensor parallelism every rank captures the same buckets at the same chunks
(the ranks run every prompt in step), the ranks' sums inside them, and tp.dist.finish resets them before the
process group goes.
"""

from __future__ import annotations

import torch

from llamafast.model import Transformer


def bucket(n: int) -> int:
    """The padded length for n prompt tokens: 64 at least, then 4 steps per power of two, so at most 25% padding
    past 256. (Below about 300 tokens a 7B chunk reads weights more than it computes on an H100, 990 TFLOP/s
    against 3.35 TB/s, so coarser padding there costs little GPU time; an estimate, not a measurement.)"""
    if n <= 64:
        return 64
    top = 1 << (n - 1).bit_length()  # the next power of two
    step = max(top // 8, 16) if n > 256 else top
    return -(-n // step) * step


def hold_if_parallel(model: Transformer, graph: torch.cuda.CUDAGraph) -> None:
    """A graph captured on a tensor-parallel model holds its collectives: tp.dist.finish resets it first."""
    if model.comm is not None:
        from llamafast.tp.dist import hold_graph

        hold_graph(graph)


class PromptGraphs:
    """Runs prompt chunks of `model` through per-bucket CUDA graphs (capture=True), or eagerly at the padded
    length (capture=False: the same arithmetic without graphs, which the CPU tests check)."""

    def __init__(self, model: Transformer, chunk: int, capture: bool = True):
        device = model.tok_embeddings.weight.device
        self.model, self.capture = model, capture
        self.tokens = torch.zeros(bucket(chunk), dtype=torch.long, device=device)  # padding: earlier prompts' ids
        self.pos = torch.zeros((), dtype=torch.long, device=device)
        self.last = torch.zeros(1, dtype=torch.long, device=device)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.seen: set[int] = set()  # buckets whose first chunk ran (eagerly, unpadded)
        self.pool = torch.cuda.graph_pool_handle() if capture else None

    def logits(self, tokens: torch.Tensor, start: int) -> torch.Tensor:
        """Writes the KV cache for tokens (n,) at positions start..; the last token's logits (1, V)."""
        n = tokens.shape[0]
        m = bucket(n)
        if m not in self.seen or start + m > self.model.cache_len:  # first of its bucket, or padding past the cache
            self.seen.add(m)
            return self.model(tokens, torch.full((), start, dtype=torch.long, device=tokens.device))
        self.tokens[:n].copy_(tokens)
        self.pos.fill_(start)
        self.last.fill_(n - 1)
        if m in self.graphs:
            graph, out = self.graphs[m]
            graph.replay()
            return out.clone()
        logits = self._forward(m)
        if self.capture:
            self.graphs[m] = self._capture(m)
        return logits

    def warm(self, m: int, start: int) -> None:
        """Captures bucket m before its first use, running its padded pass at positions start.. past the sequence
        the cache holds (rewritten before anything reads them): a chat's next turns then replay at once."""
        if m in self.graphs or start + m > self.model.cache_len:
            return
        self.pos.fill_(start)
        self.last.fill_(0)
        self._forward(m)
        self.seen.add(m)
        if self.capture:
            self.graphs[m] = self._capture(m)

    def _forward(self, m: int) -> torch.Tensor:
        return self.model(self.tokens[:m], self.pos, last=self.last)

    def _capture(self, m: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """The padded pass, captured (nothing runs): the eager pass just before compiled its kernels."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self._forward(m)
        hold_if_parallel(self.model, graph)
        return graph, out
