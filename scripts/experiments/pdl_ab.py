"""The PDL decision, timed in one process: Llama-2-7B random weights in bf16 and in each format named on the command
line (fp8: their E5M2 copy; q8_0, q4_0, q4_1: block copies, whose GEMVs take int8 activations behind
quantize_activation.py's kernel), each decoded with the decode GEMVs (and the quantize kernel) under programmatic
dependent launch and without, alternated twice. kernels/gemv.use_pdl decides; this replaces it, and the quantize
kernel's pdl_capable, to turn PDL on or off for any format. Each model's launches are tuned first, as bench does.

    PYTHONPATH=. python scripts/experiments/pdl_ab.py [fp8] [q8_0] [q4_0] [q4_1]
"""

from __future__ import annotations

import sys

import torch

from llamafast.bench.decode import bench_backend
from llamafast.config import Backend, WeightFormat
from llamafast.kernels import gemv, quantize_activation
from llamafast.load import block_copy, quantized, random_model
from llamafast.measure.common import copy_bandwidth, random_prompt
from llamafast.quant import FP8Format
from llamafast.runtime import ready_built


def set_pdl(on: bool, capable: bool) -> None:
    # K-quant GEMVs have no wait for PDL (a version that waited first lost 2-4%: pdl_ab_kquants.txt, d94fb3d)
    gemv.use_pdl = lambda w: on and capable and (not w.fmt.is_block or w.int8_activations)
    quantize_activation.pdl_capable = lambda device: on and capable


def main() -> None:
    device = torch.device("cuda")
    capable = gemv.pdl_capable(device)
    bf16 = random_model("llama-2-7b", device)
    models = [bf16]
    for name in sys.argv[1:]:
        models.append(quantized(bf16, FP8Format.e5m2) if name == "fp8" else block_copy(bf16, WeightFormat(name)))
    for lm in models:
        ready_built(lm)
    prompt = random_prompt(16, bf16.model.config.vocab_size, torch.Generator().manual_seed(0))
    bw = copy_bandwidth(device)
    print(f"{torch.cuda.get_device_name(device)}; copy bandwidth {bw:.0f} GB/s; 16 + 256 tokens")
    for lm in models:
        for rep in (1, 2):
            for pdl in (True, False):
                set_pdl(pdl, capable)
                r = bench_backend(lm, Backend.triton, prompt, 256)
                print(f"{lm.weights:9} run {rep} PDL {'on ' if pdl else 'off'}: {r.decode_tokens_per_s:.1f} tok/s, "
                      f"{100 * r.achieved_gb_s / bw:.1f}% of copy BW", flush=True)


if __name__ == "__main__":
    main()
