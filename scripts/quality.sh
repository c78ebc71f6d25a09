#!/usr/bin/env bash
# Regenerates docs/fp8.md's quality tables on the CPU (reference path, fp32 base), from a clone with the test
# data beside it:   bash scripts/quality.sh [OUTDIR]     (default scripts/results/quality)
set -euo pipefail
out=${1:-scripts/results/quality}
mkdir -p "$out"
variants=(--variant fp8_e5m2 --variant fp8_e4m3 --variant bfloat16)
llamafast eval --device cpu --model ../shared/testdata/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf "${variants[@]}" \
  --out "$out/smollm2.json" | tee "$out/smollm2.txt"
llamafast eval --device cpu "${variants[@]}" --out "$out/stories260K.json" | tee "$out/stories260K.txt"
