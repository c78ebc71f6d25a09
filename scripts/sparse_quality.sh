#!/usr/bin/env bash
# Regenerates docs/sparse-ffn.md's quality tables on the CPU (reference path, fp32), from a clone with the test
# data beside it:   bash scripts/sparse_quality.sh [OUTDIR]     (default scripts/results/sparse/quality)
# Calibration text: what each model itself samples from prompts of many registers (seeds 100+; no corpus is
# needed, and llamafast downloads nothing). Held out: eval's own sampled stream (other prompts, seeds 0-7).
set -euo pipefail
out=${1:-scripts/results/sparse/quality}
mkdir -p "$out"
smol=../shared/testdata/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
prompts=("Write a short story about a lighthouse keeper." "Explain how a computer stores numbers." "def fibonacci(n):"
  "Dear Sir or Madam, I am writing to" "In 1905, Albert Einstein published" "Here is a list of tips for travelling:"
  "The main ingredients of a good soup are" "Q: What causes the seasons? A:" "Breaking news: the city council"
  "import numpy as np" "Chapter 1. The morning was cold" "The history of the printing press")
: > "$out/smollm2_calibration.txt"
for i in "${!prompts[@]}"; do
  llamafast generate "${prompts[$i]}" --model "$smol" --device cpu --temperature 1 --top-p 1 --seed $((100 + i)) \
    --max-new-tokens 300 --echo 2>/dev/null >> "$out/smollm2_calibration.txt"
  printf '\n\n' >> "$out/smollm2_calibration.txt"
done
llamafast sparsify "$smol" "$out/smollm2-sparse" --text "$out/smollm2_calibration.txt" --device cpu --force
llamafast eval --device cpu --model "$out/smollm2-sparse" --sparsity 0.3,0.5,0.7 --variant fp8_e5m2 \
  --out "$out/smollm2.json" | tee "$out/smollm2.txt"
llamafast sparsify llamafast/data/stories260K/stories260K.bin "$out/stories260K-sparse" --group-size 4 \
  --text tests/data/stories260K_calibration.txt --device cpu --force
llamafast eval --device cpu --model "$out/stories260K-sparse" --sparsity 0.3,0.5,0.7 --variant fp8_e5m2 \
  --out "$out/stories260K.json" | tee "$out/stories260K.txt"
rm -rf "$out/smollm2-sparse" "$out/stories260K-sparse"  # 0.27 GB of weights: the recipe rebuilds them
