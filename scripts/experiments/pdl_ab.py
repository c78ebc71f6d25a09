"""The PDL decision, timed in one process: Llama-2-7B random weights, bf16 and their FP8 E5M2 copy, each decoded
with the dense decode GEMVs under programmatic dependent launch and without, alternated twice (kernels/gemv.py
launches PDL for float weights only; this turns it on and off for either format by replacing gemv.use_pdl).

    PYTHONPATH=. python scripts/experiments/pdl_ab.py
"""

from __future__ import annotations

import torch

from llamafast.measure.common import copy_bandwidth, random_prompt
from llamafast.bench.decode import bench_backend
from llamafast.config import Backend
from llamafast.kernels import gemv
from llamafast.load import quantized, random_model
from llamafast.quant import FP8Format


def main() -> None:
    device = torch.device("cuda")
    capable = gemv._pdl_capable(device)
    bf16 = random_model("llama-2-7b", device)
    models = [bf16, quantized(bf16, FP8Format.e5m2)]
    prompt = random_prompt(16, bf16.model.config.vocab_size, torch.Generator().manual_seed(0))
    bw = copy_bandwidth(device)
    print(f"{torch.cuda.get_device_name(device)}; copy bandwidth {bw:.0f} GB/s; 16 + 256 tokens")
    for lm in models:
        for rep in (1, 2):
            for pdl in (True, False):
                gemv.use_pdl = lambda d, fmt, on=pdl: on and capable
                r = bench_backend(lm, Backend.triton, prompt, 256)
                print(f"{lm.weights:9} run {rep} PDL {'on ' if pdl else 'off'}: {r.decode_tokens_per_s:.1f} tok/s, "
                      f"{100 * r.achieved_gb_s / bw:.1f}% of copy BW", flush=True)


if __name__ == "__main__":
    main()
