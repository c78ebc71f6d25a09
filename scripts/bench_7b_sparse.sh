#!/usr/bin/env bash
# Regenerates docs/sparse-ffn.md's speed figures on a GPU (run of record: an H100): dense and sparse
# decode side by side in one process (bf16, then FP8 E5M2 quantized from the same weights), each kernel against
# its reference, and the sweep behind kernels/sparse_ffn.py's CONFIGS.
#   bash scripts/bench_7b_sparse.sh [OUTDIR]     (default scripts/results/sparse)
set -euo pipefail
out=${1:-scripts/results/sparse}
mkdir -p "$out"
llamafast bench --random-weights --shape llama-2-7b --sparsity 0,0.3,0.5,0.7 --sparse-mode router --sparse-mode gate \
  --fp8 --new-tokens 256 --out "$out/bench_sparse_7b.json"
llamafast bench --kernels --shape llama-2-7b --json --out "$out/kernels_7b_bf16.json" > /dev/null
llamafast bench --kernels --shape llama-2-7b --fp8 --json --out "$out/kernels_7b_fp8.json" > /dev/null
python scripts/tune_sparse.py --shape llama-2-7b --variants router-bf16,router-fp8 --out "$out/tune_7b.json"
python scripts/profile_sparse.py --shape llama-2-7b --out "$out/profile_7b.json"
