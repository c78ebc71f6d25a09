"""Measures the aims of tuning on first use, on one GPU, in one process: tunes a shape's decode kernels
from scratch (the committed tables ignored, into a fresh folder, so nothing is reused), then decodes with the
committed tables and with the launches just tuned, alternately. The aims: at most 60 s of tuning
for a 7B-sized shape with an empty Triton cache; decode with the tuned launches at least as fast as with the
committed tables.

    TRITON_CACHE_DIR=$(mktemp -d) python scripts/tune_first_use.py --shape llama-2-7b --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

from llamafast import tuning
from llamafast.measure.common import environment, random_prompt
from llamafast.bench.decode import bench_backend
from llamafast.config import Backend, DType
from llamafast.load import random_model
from llamafast.quant import FP8Format


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="llama-2-7b")
    parser.add_argument("--fp8", choices=[f.value for f in FP8Format], help="FP8 weights of this format")
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2, help="decode runs per table, alternating")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    device = torch.device("cuda")
    fp8 = FP8Format(args.fp8) if args.fp8 else None
    lm = random_model(args.shape, device, DType.bfloat16, Backend.triton, fp8=fp8)
    plan = tuning.prepare(lm.model, folder=Path(tempfile.mkdtemp()), ignore_committed=True)
    if plan is None:
        sys.exit("tuning is off (LLAMAFAST_TUNE=0)")
    done = tuning.tune(plan)
    print(f"{args.shape}, {args.fp8 or 'bf16'} weights, on {plan.gpu}: tuned {len(done.launches)} launches from "
          f"scratch in {done.seconds:.1f} s")
    launches = []
    for (table, key), entry in sorted(done.launches.items()):
        committed = tuning.TABLES[table].get(key)
        launches.append({"table": table, "key": list(key), "tuned": entry.launch.__dict__, "us": entry.us,
                         "committed": committed and committed.__dict__})
        print(f"  {table:18} {str(key):18} tuned {entry.launch} ({entry.us:.1f} us); committed {committed}")
    prompt = random_prompt(args.prompt_len, lm.model.config.vocab_size, torch.Generator().manual_seed(0))
    runs = []
    for _ in range(args.rounds):
        for tables in ("committed", "tuned"):
            with tuning.launches(done.launches if tables == "tuned" else {}):
                r = bench_backend(lm, Backend.triton, prompt, args.new_tokens)
            runs.append({"tables": tables, "decode_tokens_per_s": r.decode_tokens_per_s,
                         "decode_ms_per_token": r.decode_ms_per_token})
            print(f"  decode with the {tables:9} tables: {r.decode_tokens_per_s:7.1f} tok/s "
                  f"({r.decode_ms_per_token:.3f} ms/token)")
    with open(args.out, "w") as f:
        json.dump({"shape": args.shape, "fp8": args.fp8, "environment": environment(device), "tune_s": done.seconds,
                   "launches": launches, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
