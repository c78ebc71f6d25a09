"""Sweeps the prefill kernels' launch settings at Llama-2-7B shapes, then the prefill chunk size.

For each tiled kernel and prompt length, every candidate TileConfig is timed (two input sets, in a CUDA graph)
and the fastest printed; then the FlashAttention kernel's (BLOCK_M, BLOCK_N, warps, stages) at 4096 tokens;
then time to first token at 4,000 tokens for several chunk sizes, with all the winners in place.

    PYTHONPATH=. python scripts/tune_prefill.py [--out FILE.json]
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
from dataclasses import asdict

import torch
import triton

from llamafast.measure.common import random_prompt
from llamafast.measure.common import time_in_graph
from llamafast.bench.prefill import time_prefill
from llamafast.config import Backend, DType, SamplingConfig, model_config
from llamafast.generate import Engine
from llamafast.load import random_model
from llamafast.bench.prefill_registry import PREFILL
from llamafast.kernels.prefill.flash_attention import FlashConfig
from llamafast.kernels.prefill.tiles import TileConfig

# The package exports the kernel functions under the modules' names, so fetch the modules themselves.
fa_mod, prefill_linear, prefill_qkv_rope, prefill_swiglu = (
    importlib.import_module(f"llamafast.kernels.{name}")
    for name in ("flash_attention", "prefill_linear", "prefill_qkv_rope", "prefill_swiglu")
)
T = TileConfig
QKV = [T(128, 256, 64, 8, 3), T(128, 256, 64, 8, 4), T(128, 128, 64, 8, 4), T(128, 64, 64, 4, 4),
       T(64, 128, 64, 4, 4), T(64, 64, 64, 4, 4)]
SWIGLU = [T(128, 128, 64, 8, 4), T(128, 128, 64, 8, 3), T(64, 128, 64, 4, 3), T(128, 64, 64, 4, 4),
          T(64, 128, 64, 4, 4)]
PLAIN = [T(128, 256, 64, 8, 3), T(128, 128, 64, 8, 4), T(128, 128, 128, 8, 3), T(128, 64, 64, 4, 4),
         T(64, 128, 64, 4, 4), T(64, 64, 64, 4, 4)]
FLASH = [FlashConfig(64, 64, 4, 3), FlashConfig(128, 128, 8, 3), FlashConfig(128, 64, 8, 3)]
KERNELS = [
    ("prefill_qkv_rope", prefill_qkv_rope, QKV), ("prefill_swiglu", prefill_swiglu, SWIGLU),
    ("prefill_linear_residual[wo]", prefill_linear, PLAIN), ("prefill_linear_residual[w2]", prefill_linear, PLAIN),
]
LENGTHS = [128, 512, 4000]
CHUNKS = [1024, 2048, 4096]


def sweep(name, module, candidates, config, m, rows):
    spec = PREFILL[name]
    sets = [spec.make_inputs(config, torch.bfloat16, torch.device("cuda"), m, 0, None) for _ in range(2)]
    flops = spec.flops(config, m, 0)
    best = None
    for cfg in candidates:
        try:
            us = time_in_graph(functools.partial(spec.kernel, configs={1 << 30: cfg}), sets)
        except triton.runtime.errors.OutOfResources as e:  # e.g. shared memory of a deep TMA pipeline
            print(f"{name:30s} M={m:5d} {cfg}: {e}")
            continue
        rows.append({"kernel": name, "m": m, "config": asdict(cfg), "us": us, "tflop_s": flops / us / 1e6})
        best = min(best or (us, cfg), (us, cfg), key=lambda t: t[0])
    ref = time_in_graph(spec.reference, sets)
    print(f"{name:30s} M={m:5d} best {best[0]:8.1f} us {flops / best[0] / 1e6:6.1f} TFLOP/s {best[1]}; "
          f"reference {ref:8.1f} us")
    return best


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    a = p.parse_args()
    config = model_config("llama-2-7b")
    rows, winners = [], {}
    for name, module, candidates in KERNELS:
        for m in LENGTHS:
            winners[(name, m)] = sweep(name, module, candidates, config, m, rows)[1]
    spec = PREFILL["flash_attention"]
    sets = [spec.make_inputs(config, torch.bfloat16, torch.device("cuda"), 4096, 0, None)]
    for cfg in FLASH:
        us = time_in_graph(functools.partial(spec.kernel, configs={128: cfg}), sets)
        tflops = spec.flops(config, 4096, 0) / us / 1e6
        rows.append({"kernel": "flash_attention", "m": 4096, "config": asdict(cfg), "us": us, "tflop_s": tflops})
        print(f"flash_attention M=4096 {cfg}: {us:8.1f} us {tflops:6.1f} TFLOP/s")
    # The winners go into the kernels' CONFIGS tables by hand; the chunk sweep below runs the shipped tables.
    lm = random_model("llama-2-7b", torch.device("cuda"), DType.bfloat16, Backend.triton)
    ids = random_prompt(4000, 32000, torch.Generator().manual_seed(0))
    for chunk in CHUNKS:
        engine = Engine(lm.model, SamplingConfig(temperature=0), 4001, prefill_chunk=chunk)
        torch.cuda.reset_peak_memory_stats()
        time_prefill(engine, ids, 1)
        times = sorted(time_prefill(engine, ids, 7))
        peak = torch.cuda.max_memory_allocated() / 1e9
        rows.append({"chunk": chunk, "ttft_ms_4000": times[3] * 1e3, "peak_gb": peak})
        print(f"chunk {chunk}: ttft at 4000 tokens {times[3] * 1e3:.2f} ms (min {times[0] * 1e3:.2f})")
        del engine
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
