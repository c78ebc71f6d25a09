"""Decode attention under programmatic dependent launch, timed in one process: Llama-2-7B random weights in bf16
and their FP8 E5M2 copy, each decoded with the attention kernel launched under PDL (it starts in RMSNorm + QKV's
last wave and lets wo's GEMV start at once) and without, alternated twice. tried.diff's
kernels/decode_attention.use_pdl decides; this replaces it. Each model's launches are tuned first, as bench does.
Runs with tried.diff applied (on def3cc6's parent), on a GPU:

    git apply scripts/experiments/attention_pdl/tried.diff
    PYTHONPATH=. python scripts/experiments/attention_pdl/attention_pdl_ab.py
"""

from __future__ import annotations

import importlib

import torch

from llamafast.bench.decode import bench_backend
from llamafast.config import Backend
from llamafast.load import quantized, random_model
from llamafast.measure.common import copy_bandwidth, random_prompt
from llamafast.quant import FP8Format
from llamafast.runtime import ready_built

# The module: the package's name decode_attention is the kernel's host function.
decode_attention = importlib.import_module("llamafast.kernels.decode_attention")


def main() -> None:
    device = torch.device("cuda")
    capable = decode_attention.use_pdl(device)
    bf16 = random_model("llama-2-7b", device)
    models = [bf16, quantized(bf16, FP8Format.e5m2)]
    for lm in models:
        ready_built(lm)
    prompt = random_prompt(16, bf16.model.config.vocab_size, torch.Generator().manual_seed(0))
    bw = copy_bandwidth(device)
    print(f"{torch.cuda.get_device_name(device)}; copy bandwidth {bw:.0f} GB/s; 16 + 256 tokens; PDL capable {capable}")
    for lm in models:
        for rep in (1, 2):
            for pdl in (True, False):
                decode_attention.use_pdl = lambda d, on=pdl: on and capable
                r = bench_backend(lm, Backend.triton, prompt, 256)
                print(f"{lm.weights:9} run {rep} attention PDL {'on ' if pdl else 'off'}: "
                      f"{r.decode_tokens_per_s:.1f} tok/s, {r.decode_ms_per_token:.4f} ms/token, "
                      f"{100 * r.achieved_gb_s / bw:.1f}% of copy BW", flush=True)


if __name__ == "__main__":
    main()
