"""The decode step's kernels that run without programmatic dependent launch (PDL), launched under it, timed in one
process on a GPU against the step as it is, alternated: random weights of each SHAPE (bf16, and FP8 / block formats
as --fp8 / --weights ask), 16 + 256 tokens decoded greedily (--temperature: sampled), each way's graph captured
once, then replayed with the host reading nothing (and streamed, as bench times it, in the first round).

- off: the step as committed: attention, the sampler and advance_state launched plainly.
- attn_start: attention under PDL, letting wo launch as it starts (decode_attention.PDL_MODE 1).
- attn_end: attention under PDL, letting wo launch as its programs end (PDL_MODE 2).
- tail: the sampler and advance_state under PDL (each starts in the kernel ahead's last wave and waits there).
- attn_end_tail: both.

Each way's greedy tokens are compared with off's.

    PYTHONPATH=. python scripts/experiments/pdl_edges/ab.py smollm2-135m llama-2-7b --fp8 e5m2

It runs on the tree with tried.diff applied (git apply): the module switches it sets exist only there; the
committed code keeps attn_start alone, as AttentionConfig.pdl, which tuning chooses in the step.
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
from llamafast.sampling import SamplingConfig  # noqa: E402

attention = importlib.import_module("llamafast.kernels.decode_attention")
sampler = importlib.import_module("llamafast.kernels.sample_token")
advance = importlib.import_module("llamafast.kernels.advance_state")
NEW = 256
WAYS = {"off": (0, False), "attn_start": (1, False), "attn_end": (2, False), "tail": (0, True),
        "attn_end_tail": (2, True)}


def set_way(name: str) -> None:
    mode, tail = WAYS[name]
    attention.PDL_MODE, sampler.PDL, advance.PDL = mode, tail, tail


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("shapes", nargs="+")
    p.add_argument("--fp8", nargs="*", default=[])
    p.add_argument("--weights", nargs="*", default=[])
    p.add_argument("--ways", nargs="*", default=list(WAYS))
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args()
    device = torch.device("cuda")
    sampling = SamplingConfig(temperature=a.temperature, seed=1)
    for shape in a.shapes:
        prompt = None
        for name, lm in models(shape, a.fp8, a.weights, device):
            model, prompt = opened(lm, shape, NEW, f"temperature {a.temperature}", prompt)
            engines = {}
            for way in a.ways:  # each way's graphs captured under its settings
                set_way(way)
                engines[way] = Engine(model, sampling, len(prompt) + NEW)
                warm([engines[way]], prompt)
            set_way("off")
            ids = {}
            for way, e in engines.items():
                us, ids[way] = streamed(stream_tokens(e, prompt, NEW))
                print(f"{name:9} streamed {way:13}: {us:8.1f} µs a step", flush=True)
            for rep in range(a.reps):
                line = "  ".join(f"{way} {replayed(e, prompt, NEW):8.1f}" for way, e in engines.items())
                print(f"{name:9} run {rep + 1} replayed µs a step: {line}", flush=True)
            same = [way for way in engines if ids[way] == ids[a.ways[0]]]
            print(f"{name:9} tokens equal to {a.ways[0]}'s: {', '.join(same)}", flush=True)
            del engines, model, lm
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
