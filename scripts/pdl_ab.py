"""A/B of programmatic dependent launch (PDL) in the triton backend: end-to-end decode on Llama-2-7B
random weights, alternating PDL on and off in one process, twice each.

    python scripts/pdl_ab.py [--prompt-len 16] [--new-tokens 256] [--fp8 e5m2]
"""

from __future__ import annotations

import argparse

import torch

from llamafast.bench.decode import copy_bandwidth, run_bench
from llamafast.config import Backend, DType
from llamafast.kernels import gemv
from llamafast.load import random_model
from llamafast.quant import FP8Format


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="llama-2-7b")
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--fp8", choices=[f.value for f in FP8Format])
    args = parser.parse_args()
    fp8 = FP8Format(args.fp8) if args.fp8 else None
    lm = random_model(args.shape, torch.device("cuda"), DType.bfloat16, Backend.triton, fp8=fp8)
    print(f"copy bandwidth {copy_bandwidth(torch.device('cuda')):.0f} GB/s")
    for pdl in (True, False, True, False):
        gemv.ENABLE_PDL = pdl
        gemv.use_pdl.cache_clear()
        r = run_bench([lm], [Backend.triton], args.prompt_len, args.new_tokens).results[0]
        print(f"{lm.weights} pdl={pdl!s:5} {r.decode_tokens_per_s:7.1f} tok/s {r.decode_ms_per_token:6.3f} ms/token "
              f"{r.achieved_gb_s:5.0f} GB/s ({100 * r.fraction_of_copy_bw:.1f}% of copy)")


if __name__ == "__main__":
    main()
