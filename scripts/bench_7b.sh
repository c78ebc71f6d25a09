#!/usr/bin/env bash
# Regenerates the README's Llama-2-7B decode figures on one GPU (run on nvidia-h100-x1):
#   bash scripts/bench_7b.sh [OUTDIR]
# Writes OUTDIR/bench_7b.{txt,json} and bench_7b_long.{txt,json} (default OUTDIR: scripts/results).
set -euo pipefail
out=${1:-scripts/results}
mkdir -p "$out"
python -m llamafast bench --config configs/bench-7b.toml --out "$out/bench_7b.json" | tee "$out/bench_7b.txt"
python -m llamafast bench --config configs/bench-7b-long-context.toml --out "$out/bench_7b_long.json" \
  | tee "$out/bench_7b_long.txt"
