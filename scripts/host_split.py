"""Where the host's time to queue one 7B prefill goes (triton backend, bf16): the whole forward pass; the same
with every kernel launch skipped (the model loop and the ops' Python: checks, allocations, launch settings);
the recorded launches alone through kernels/launcher.py; and the recorded launches as bare calls of the
compiled kernels. Minimum of 20 timings each, GPU idle at the start of each.

    python scripts/host_split.py [--lengths 128,512]
"""

from __future__ import annotations

import argparse
import importlib

import torch

from llamafast.bench.prefill import host_time, random_prompts, time_prefill
from llamafast.config import Backend, DType, SamplingConfig
from llamafast.generate import Engine
from llamafast.load import random_model

launcher = importlib.import_module("llamafast.kernels.launcher")


def best_of(fn, n: int = 20) -> float:
    return min(host_time(fn) for _ in range(n)) * 1e3


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--lengths", default="128,512")
    a = p.parse_args()
    lengths = [int(n) for n in a.lengths.split(",")]
    lm = random_model("llama-2-7b", torch.device("cuda"), DType.bfloat16, Backend.triton)
    engine = Engine(lm.model, SamplingConfig(temperature=0), max(lengths) + 1)
    for n, ids in random_prompts(lengths, lm.model.config.vocab_size).items():
        print(f"{n:5d} tokens: " + split(engine, ids))


def split(engine: Engine, ids: list[int]) -> str:
    tokens = torch.tensor(ids, device="cuda")
    time_prefill(engine, ids, 3)  # compile, fill the launchers' caches
    whole = best_of(lambda: engine.prompt_logits(tokens))
    launch, calls = launcher.Launcher.launch, []
    launcher.Launcher.launch = lambda self, grid, args, kw: None  # holding args would keep every buffer alive
    skipped = best_of(lambda: engine.prompt_logits(tokens))
    launcher.Launcher.launch = lambda self, grid, args, kw: calls.append((self, grid, args, kw))
    engine.prompt_logits(tokens)  # one forward pass's launches, recorded
    launcher.Launcher.launch = launch
    direct = best_of(lambda: [launch(s, g, args, kw) for s, g, args, kw in calls])
    bare, device = [], torch.cuda.current_device()
    for s, g, args, kw in calls:
        c = s.compiled[(device, tuple(launcher._arg_key(x) for x in args), tuple(kw.items()))]
        bare.append((c, (*g, 1, 1)[:3], (*args, *(kw[name] for name in s.names[len(args):]))))
    stream = torch.cuda.current_stream().cuda_stream
    only = best_of(lambda: [c.run(*g, stream, c.function, c.packed_metadata, None, None, None, *b)
                            for c, g, b in bare])
    return (f"{len(calls)} launches: whole {whole:.2f} ms; launches skipped {skipped:.2f}; launches alone via "
            f"Launcher {direct:.2f}; as bare compiled.run calls {only:.2f}")

if __name__ == "__main__":
    main()
