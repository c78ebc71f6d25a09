"""Decode attention under programmatic dependent launch, in two forms, against none, timed in one process:
Llama-2-7B random weights in bf16 and their FP8 E5M2 copy, each decoded three ways, alternated twice. late.diff's
kernels/decode_attention.PDL_MODE decides: "start" lets wo's GEMV launch at once (tried.diff's form, which lost),
"end" only once attention's programs are done, so only attention's own launch moves into RMSNorm + QKV's last
wave; "off" is the committed kernel. Runs with late.diff applied, on a GPU:

    git apply scripts/experiments/attention_pdl/late.diff
    PYTHONPATH=. python scripts/experiments/attention_pdl/late_ab.py
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

decode_attention = importlib.import_module("llamafast.kernels.decode_attention")


def main() -> None:
    device = torch.device("cuda")
    bf16 = random_model("llama-2-7b", device)
    models = [bf16, quantized(bf16, FP8Format.e5m2)]
    for lm in models:
        ready_built(lm)
    prompt = random_prompt(16, bf16.model.config.vocab_size, torch.Generator().manual_seed(0))
    bw = copy_bandwidth(device)
    print(f"{torch.cuda.get_device_name(device)}; copy bandwidth {bw:.0f} GB/s; 16 + 256 tokens")
    for lm in models:
        for rep in (1, 2):
            for mode in ("off", "end", "start"):
                decode_attention.PDL_MODE = mode
                r = bench_backend(lm, Backend.triton, prompt, 256)
                print(f"{lm.weights:9} run {rep} attention PDL {mode:5}: {r.decode_tokens_per_s:.1f} tok/s, "
                      f"{r.decode_ms_per_token:.4f} ms/token, {100 * r.achieved_gb_s / bw:.1f}% of copy BW", flush=True)


if __name__ == "__main__":
    main()
