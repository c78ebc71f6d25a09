#!/usr/bin/env bash
# Regenerates docs/benchmarks.md's Llama-2-7B decode figures on one GPU (run of record: an H100):
#   bash scripts/bench_7b.sh [OUTDIR]
# Writes into OUTDIR (default scripts/results):
#   bench_7b_cold.*  triton alone with an empty Triton cache: the cold-start cost
#   bench_7b.*       reference, compile and triton side by side, 16-token prompt, 256 new tokens
#   bench_7b_long.*  the same at a 3,500-token prompt
#   kernels_7b.*     each decode kernel against its reference at 4,096 tokens of context
set -euo pipefail
out=${1:-scripts/results}
mkdir -p "$out"
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$(mktemp -d)}
rm -rf "$TRITON_CACHE_DIR"/*
python -m llamafast bench --config configs/bench-7b.toml --backend triton --out "$out/bench_7b_cold.json" \
  | tee "$out/bench_7b_cold.txt"
python -m llamafast bench --config configs/bench-7b.toml --out "$out/bench_7b.json" | tee "$out/bench_7b.txt"
python -m llamafast bench --config configs/bench-7b-long-context.toml --out "$out/bench_7b_long.json" \
  | tee "$out/bench_7b_long.txt"
python -m llamafast bench --kernels --shape llama-2-7b --context 4096 --out "$out/kernels_7b.json" \
  | tee "$out/kernels_7b.txt"
