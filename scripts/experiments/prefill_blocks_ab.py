"""The prompt path for block weights, timed in one process: Llama-2-7B random weights in bf16 and block copies in
each format named on the command line (default q8_0 q4_0 q4_k q6_k; q4_k_m too), each prompt pass run with the
prefill matmuls dequantizing their weight tiles in registers (in-matmul) and with each layer's weights dequantized
to bf16 scratch tensors just before its ops (scratch), alternated twice (A B A B) at each length. Time to first
token as `bench prefill` takes it (llamafast.bench.prefill.warmed_times: ids on the host to the first token back,
prompt graphs, chunks of generate.PREFILL_CHUNK, warm-up runs first); the LM head's decode launches are not tuned.
backends.BLOCK_SCRATCH_ROWS decides between the paths; this sets it to force one. Each timed run gets a fresh model
and Engine, so no prompt graph captured on one path is replayed on the other. First, per format, the two paths'
logits of one 512-token pass (every position) are compared. Must finish within 6 minutes on an H100.

    PYTHONPATH=. python scripts/experiments/prefill_blocks_ab.py [q8_0 q4_0 q4_k q6_k] [--reps 5]
    # raw output: scripts/experiments/prefill_blocks_ab.txt
"""

from __future__ import annotations

import argparse
import subprocess
import time

import torch

from llamafast import backends
from llamafast.backends import with_backend
from llamafast.bench.prefill import warmed_times
from llamafast.config import Backend, SamplingConfig, WeightFormat
from llamafast.generate import Engine
from llamafast.load import LoadedModel, block_copy, random_model
from llamafast.load.blocks import MIXES
from llamafast.measure.common import environment, random_prompt

PATHS = {"in-matmul": 1 << 30, "scratch": 0}  # BLOCK_SCRATCH_ROWS that forces each: no prompt reaches 2**30 rows
DEFAULT = ["q8_0", "q4_0", "q4_k", "q6_k"]


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def agreement(lm: LoadedModel, ids: list[int]) -> tuple[float, float]:
    """(max |a - b|, RMS(a - b) / RMS(b)) of one prompt pass's fp32 logits at every position: a in-matmul, b
    scratch."""
    model = with_backend(lm.model, Backend.triton)
    model.setup_cache(len(ids))
    device = model.tok_embeddings.weight.device
    tokens, pos = torch.tensor(ids, device=device), torch.zeros((), dtype=torch.long, device=device)
    logits = {}
    for path, rows in PATHS.items():
        backends.BLOCK_SCRATCH_ROWS = rows
        logits[path] = model(tokens, pos, True)
    a, b = logits["in-matmul"], logits["scratch"]
    return (a - b).abs().max().item(), ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt()).item()


def timed(lm: LoadedModel, ids: list[int], reps: int, cache_len: int) -> list[float]:
    """Sorted seconds to first token of `reps` runs, after bench prefill's warm-up runs (compilation, prompt graph
    capture)."""
    model = with_backend(lm.model, Backend.triton)
    engine = Engine(model, SamplingConfig(temperature=0), cache_len)
    times = warmed_times(engine, ids, reps)
    del engine, model
    torch.cuda.empty_cache()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("formats", nargs="*", default=DEFAULT, help=f"block formats [default: {' '.join(DEFAULT)}]")
    parser.add_argument("--reps", type=int, default=5, help="timed runs per variant (median and min reported)")
    parser.add_argument("--lengths", default="512,4000", help="comma-separated prompt lengths")
    args = parser.parse_args()
    fmts = [MIXES[f] if f in MIXES else WeightFormat(f) for f in args.formats]
    lengths = [int(n) for n in args.lengths.split(",")]
    device, t0 = torch.device("cuda"), time.perf_counter()
    env = environment(device)
    print(f"{env['device']}; torch {env['torch']}, triton {env['triton']}, CUDA {env['cuda']}; commit {commit()}; "
          f"Llama-2-7B random weights, bf16 activations; median and min of {args.reps} runs per variant", flush=True)
    bf16 = random_model("llama-2-7b", device, backend=Backend.triton)
    gen = torch.Generator().manual_seed(0)
    prompts = {n: random_prompt(n, bf16.model.config.vocab_size, gen) for n in lengths}
    cache_len = max(lengths) + 1  # as bench prefill sizes its cache
    rows = []  # (format, tokens, path, run, median ms, min ms)

    def record(fmt: str, n: int, path: str, run: int, times: list[float]) -> None:
        rows.append((fmt, n, path, run, 1e3 * times[len(times) // 2], 1e3 * times[0]))
        print(f"  {fmt:7} {n:5} {path:9} run {run}: median {rows[-1][4]:8.2f} ms, min {rows[-1][5]:8.2f} ms "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)

    for run in (1, 2):
        for n in lengths:
            record("bf16", n, "-", run, timed(bf16, prompts[n], args.reps, cache_len))
    for fmt in fmts:
        lm = block_copy(bf16, fmt)
        check = prompts[512] if 512 in prompts else random_prompt(512, bf16.model.config.vocab_size, gen)
        diff, rel = agreement(lm, check)
        print(f"{fmt.value}: 512-token logits, in-matmul against scratch: max abs diff {diff:.3e}, relative RMS "
              f"{rel:.3e} ({time.perf_counter() - t0:.0f} s)", flush=True)
        for n in lengths:
            for run in (1, 2):
                for path, scratch_rows in PATHS.items():
                    backends.BLOCK_SCRATCH_ROWS = scratch_rows
                    record(fmt.value, n, path, run, timed(lm, prompts[n], args.reps, cache_len))
        del lm
        torch.cuda.empty_cache()
    print(f"\n{'format':8} {'tokens':>6} {'path':9} {'run':>3} {'median ms':>10} {'min ms':>9}")
    for fmt, n, path, run, median, least in rows:
        print(f"{fmt:8} {n:6} {path:9} {run:3} {median:10.2f} {least:9.2f}")
    print(f"peak memory {torch.cuda.max_memory_allocated(device) / 1e9:.1f} GB; {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
