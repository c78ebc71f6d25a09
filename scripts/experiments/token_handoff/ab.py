"""How each new token reaches the host, timed both ways in one process on a GPU, alternated: random weights of
SHAPE in each of --weights (bf16, and block formats made as `bench --weights` makes them), 256 tokens decoded
greedily after a 16-token prompt, the host reading every token as it comes.

- ring: today's stream_tokens (`bench decode`'s figure): the step's last program (kernels/advance_state.py) sets
  the token, its seen flag, the position, and writes the token into a ring slot in pinned host memory.
- copy: the way before it: torch's ops for the state (a copy, index_fill, add), then a device-to-host copy of the
  token into a pinned buffer after each step, on the stream between one step and the next.
- replay: the same decode steps with the host reading nothing (one synchronize at the end): the floor both aim at.

Each way's tokens are compared with the ring's (greedy: they must be equal).

    PYTHONPATH=. python scripts/experiments/token_handoff/ab.py llama-2-7b --weights bf16 q8_0
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine_ab import opened, replayed, streamed, warm  # noqa: E402

from llamafast.config import Backend, DType, WeightFormat  # noqa: E402
from llamafast.generate import Engine, stream_tokens  # noqa: E402
from llamafast.load import random_block_models, random_model  # noqa: E402
from llamafast.sampling import SamplingConfig, uses_counts  # noqa: E402

NEW = 256


class CopyEngine(Engine):
    """The engine as it advanced its state before advance_state: four torch ops, no ring."""

    def _advance(self, nxt: torch.Tensor, n: int) -> None:
        self.token.copy_(nxt)
        self.seen.index_fill_(0, self.token, True)
        if uses_counts(self.sampling):
            self.counts.index_add_(0, self.token, torch.ones_like(self.counts[:1]))
        self.pos.add_(n)


def copy_stream(engine: Engine, prompt: list[int], n: int):
    """stream_tokens before the ring: each token copied to a pinned buffer after its step, an event behind it."""
    engine.prefill(prompt)
    bufs = [torch.empty(1, dtype=torch.long, pin_memory=True) for _ in range(2)]
    events = [torch.cuda.Event() for _ in range(2)]
    for i in range(n):
        buf, ev = bufs[i % 2], events[i % 2]
        if i == 1:
            engine.decode()
        buf.copy_(engine.token, non_blocking=True)
        ev.record()
        if 0 < i < n - 1:
            engine.decode()
        ev.synchronize()
        yield int(buf[0])


def models(shape: str, weights: list[str], device):
    if "bf16" in weights:
        yield "bf16", random_model(shape, device, DType.bfloat16, Backend.triton)
    blocks = [WeightFormat(w) for w in weights if w != "bf16"]
    if blocks:
        for w, lm in zip(blocks, random_block_models(shape, device, DType.bfloat16, Backend.triton, blocks)):
            yield w.value, lm


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("shape")
    p.add_argument("--weights", nargs="+", default=["bf16"])
    p.add_argument("--reps", type=int, default=2)
    a = p.parse_args()
    device = torch.device("cuda")
    greedy = SamplingConfig(temperature=0)
    prompt = None
    for name, lm in models(a.shape, a.weights, device):
        model, prompt = opened(lm, a.shape, NEW, "greedy", prompt)
        ring = Engine(model, greedy, len(prompt) + NEW)
        copy = CopyEngine(model, greedy, len(prompt) + NEW)
        warm((ring, copy), prompt)
        for rep in range(a.reps):
            ring_us, ring_ids = streamed(stream_tokens(ring, prompt, NEW))
            copy_us, copy_ids = streamed(copy_stream(copy, prompt, NEW))
            replay_us = replayed(ring, prompt, NEW)
            same = "equal" if copy_ids == ring_ids else "DIFFER"
            print(f"{name:9} run {rep + 1}: µs per step: ring {ring_us:8.1f}, copy {copy_us:8.1f}, replay "
                  f"{replay_us:8.1f}; ring {1e6 / ring_us:7.1f} tok/s, copy {1e6 / copy_us:7.1f}; tokens {same}",
                  flush=True)
        del ring, copy, model, lm
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
