"""Each prefill kernel beside its torch reference (cuBLAS, SDPA) at Llama-2-7B for M prompt tokens, and the
FlashAttention kernel against torch SDPA's flash backend at 4096 x 32 heads x 128, causal.

    PYTHONPATH=. python scripts/bench_prefill_kernels.py [--dtype bfloat16] [--m 512 --m 4000] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json

import torch

from llamafast.bench.decode import copy_bandwidth, environment
from llamafast.bench.kernels import bench_prefill_kernels, flash_vs_sdpa
from llamafast.config import model_config


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="llama-2-7b")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    p.add_argument("--m", type=int, action="append")
    p.add_argument("--out")
    a = p.parse_args()
    dtype = getattr(torch, a.dtype)
    device = torch.device("cuda")
    report = {"shape": a.shape, "dtype": a.dtype, "environment": environment(device),
              "copy_bw_gb_s": copy_bandwidth(device), "kernels": [], "flash_vs_sdpa": {}}
    print(f"{a.shape} {a.dtype} on {report['environment']['device']}")
    print(f"{'kernel':30s} {'M':>5s} {'us':>9s} {'TFLOP/s':>8s} {'ref us':>9s} {'ref TFLOP/s':>11s} {'speedup':>7s}")
    for m in a.m or [512, 4000]:
        for r in bench_prefill_kernels(model_config(a.shape), dtype, m):
            report["kernels"].append(r.to_dict())
            print(f"{r.name:30s} {r.m:5d} {r.us:9.1f} {r.tflop_s:8.1f} {r.reference_us:9.1f} "
                  f"{r.reference_tflop_s:11.1f} {r.reference_us / r.us:6.2f}x")
    f = report["flash_vs_sdpa"] = flash_vs_sdpa(dtype=dtype)
    print(f"flash_attention causal {f['seq']} x {f['heads']} x {f['head_dim']}: {f['flash_attention_us']:.1f} us = "
          f"{f['flash_attention_tflop_s']:.1f} TFLOP/s; SDPA flash {f['sdpa_flash_us']:.1f} us = "
          f"{f['sdpa_flash_tflop_s']:.1f} TFLOP/s; ratio {f['ratio']:.2f}x")
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(report, fh, indent=1)


if __name__ == "__main__":
    main()
