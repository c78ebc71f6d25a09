"""Where a decode step's input row comes from, timed both ways in one process on a GPU, alternated: random weights
of SHAPE in bf16 and in each of --fp8 / --weights, 16 + 256 tokens decoded greedily.

- row: today's Engine: advance_state copies the new token's embedding row into Engine.x as it sets the state, and
  the next step's first kernel reads it.
- gather: the way before it: advance_state without the row (the same kernel with a row of no values, one warp as
  it was launched), and each step starts with torch's gather of the token's row.

Each way is timed as `bench decode` times it (stream_tokens, the host reading every token) and replayed with the
host reading nothing; the gather's greedy tokens are compared with the row's (they must be equal).

    PYTHONPATH=. python scripts/experiments/embedding_row/ab.py smollm2-135m llama-2-7b --fp8 e5m2 --weights q4_0
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine_ab import models, opened, replayed, streamed, warm  # noqa: E402

from llamafast.generate import Engine, stream_tokens  # noqa: E402
from llamafast.sampling import SamplingConfig, uses_counts  # noqa: E402

advance = importlib.import_module("llamafast.kernels.advance_state")
NEW = 256


class GatherEngine(Engine):
    """The engine as it ran before the row moved into advance_state: the step gathers its own input."""

    def _next_token(self, token, pos, seen):
        return self._pick(self.model(token, pos)[0], seen)

    def _advance(self, nxt: torch.Tensor, n: int) -> None:
        advance._advance_kernel[(1,)](nxt, self.token, self.seen, self.counts, self.pos, self.ring, self.x, self.x, n,
                                      0, RING=self.ring.numel(), COUNTED=uses_counts(self.sampling), BLOCK=16,
                                      num_warps=1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("shapes", nargs="+")
    p.add_argument("--fp8", nargs="*", default=[])
    p.add_argument("--weights", nargs="*", default=[])
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args()
    device = torch.device("cuda")
    greedy = SamplingConfig(temperature=0)
    for shape in a.shapes:
        prompt = None
        for name, lm in models(shape, a.fp8, a.weights, device):
            model, prompt = opened(lm, shape, NEW, "greedy", prompt)
            row = Engine(model, greedy, len(prompt) + NEW)
            gather = GatherEngine(model, greedy, len(prompt) + NEW)
            warm((row, gather), prompt)
            for rep in range(a.reps):
                row_us, row_ids = streamed(stream_tokens(row, prompt, NEW))
                gather_us, gather_ids = streamed(stream_tokens(gather, prompt, NEW))
                row_r, gather_r = replayed(row, prompt, NEW), replayed(gather, prompt, NEW)
                same = "equal" if gather_ids == row_ids else "DIFFER"
                print(f"{name:9} run {rep + 1}: µs per step streamed: row {row_us:8.1f}, gather {gather_us:8.1f}; "
                      f"replayed: row {row_r:8.1f}, gather {gather_r:8.1f}; streamed tok/s row {1e6 / row_us:7.1f}, "
                      f"gather {1e6 / gather_us:7.1f}; tokens {same}", flush=True)
            del row, gather, model, lm
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
