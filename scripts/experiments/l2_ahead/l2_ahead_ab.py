"""Asking L2 for wo's weights during attention (l2_ahead.diff's kernels/l2_ahead.py), timed in one process: random
weights of one shape (Llama-2-7B: bf16 and its FP8 E5M2 copy; Llama-2-70B: FP8 E5M2 alone, made tensor by tensor),
each decoded with each of VARIANTS (the prefetch's budget as a fraction of the L2, 0 for none; bulk requests or one
per line), alternated three times. l2_ahead.budget and l2_ahead.LINES decide; this replaces them. Each model's
launches are tuned first, as bench does. With the diff applied, on a GPU:

    PYTHONPATH=. python scripts/experiments/l2_ahead/l2_ahead_ab.py llama-2-7b|llama-2-70b
"""

from __future__ import annotations

import sys

import torch

from llamafast.bench.decode import bench_backend
from llamafast.config import Backend
from llamafast.kernels import l2_ahead
from llamafast.load import quantized, random_model
from llamafast.measure.common import copy_bandwidth, random_prompt
from llamafast.quant import FP8Format
from llamafast.runtime import ready_built

VARIANTS = ((0.0, False), (0.5, False), (0.5, True), (1.0, True))  # (budget as a fraction of L2, LINES)


def main() -> None:
    shape = sys.argv[1]
    device = torch.device("cuda")
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    if shape == "llama-2-70b":
        models, new_tokens = [random_model(shape, device, fp8=FP8Format.e5m2)], 128
    else:
        bf16 = random_model(shape, device)
        models, new_tokens = [bf16, quantized(bf16, FP8Format.e5m2)], 256
    for lm in models:
        ready_built(lm)
    prompt = random_prompt(16, models[0].model.config.vocab_size, torch.Generator().manual_seed(0))
    bw = copy_bandwidth(device)
    print(f"{torch.cuda.get_device_name(device)}; L2 {l2 / 2**20:.0f} MiB; copy bandwidth {bw:.0f} GB/s; "
          f"{shape}, 16 + {new_tokens} tokens", flush=True)
    for lm in models:
        for rep in (1, 2, 3):
            for fraction, lines in VARIANTS:
                l2_ahead.budget = lambda d, f=fraction: int(f * l2)
                l2_ahead.LINES = lines
                r = bench_backend(lm, Backend.triton, prompt, new_tokens)
                form = "lines" if lines else "bulk "
                print(f"{lm.weights:9} run {rep} budget {fraction:4} of L2 {form}: {r.decode_tokens_per_s:.1f} tok/s, "
                      f"{r.decode_ms_per_token:.4f} ms/token, {100 * r.achieved_gb_s / bw:.1f}% of copy BW",
                      flush=True)


if __name__ == "__main__":
    main()
