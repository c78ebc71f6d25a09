#!/usr/bin/env bash
# Regenerates docs/benchmarks.md's Llama-2-7B prefill figures on one GPU (run of record: an H100):
#   bash scripts/bench_prefill_7b.sh [OUTDIR] [CHUNK]
# Writes into OUTDIR (default scripts/results):
#   tune_prefill.*          launch sweep of the prefill kernels, FlashAttention blocks, TTFT at 4,000 tokens per chunk
#   bench_prefill_7b.*      time to first token at 128, 512, 2,048 and 4,000 tokens, triton beside reference
#   prefill_kernels_7b.*    each prefill kernel beside cuBLAS/SDPA at 512 and 4,000 tokens; FlashAttention
#                           against SDPA's flash backend at 4,096 x 32 heads x 128, causal
# CHUNK (default: the engine's PREFILL_CHUNK) is the bench's prompt tokens per forward pass.
set -euo pipefail
out=${1:-scripts/results}
mkdir -p "$out"
PYTHONPATH=. python scripts/tune_prefill.py --out "$out/tune_prefill.json" | tee "$out/tune_prefill.txt"
chunk_opt=()
if [[ -n "${2:-}" ]]; then chunk_opt=(--chunk "$2"); fi
python -m llamafast bench --random-weights --shape llama-2-7b --prefill "${chunk_opt[@]}" \
  --out "$out/bench_prefill_7b.json" | tee "$out/bench_prefill_7b.txt"
python -m llamafast bench --kernels --prefill --shape llama-2-7b --out "$out/prefill_kernels_7b.json" \
  | tee "$out/prefill_kernels_7b.txt"
