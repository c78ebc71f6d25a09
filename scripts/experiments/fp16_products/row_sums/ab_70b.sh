#!/usr/bin/env bash
# One call on one H200: 70B FP8 E5M2 decode with the fp16 products (this tree) and with fp32 products
# (row_sums.diff reverted), each bench in its own process, on the committed H200 launches.
# Lost on one H200 at 8ed0f8f: 70B FP8 50.2 against 52.3 tok/s (bench_70b_*.txt, log_70b.txt). To repeat: apply
# row_sums.diff at 8ed0f8f, then
#   bash scripts/experiments/fp16_products/row_sums/ab_70b.sh OUTDIR
set -u
out=${1:?}
mkdir -p "$out"
. scripts/gpu_env.sh || exit 1
here=scripts/experiments/fp16_products/row_sums
SECONDS=0
b="python3 -m llamafast bench --random-weights --fp8 --backend triton --shape llama-2-70b --new-tokens 128"
for variant in fp16 fp32; do
  [ "$variant" = fp32 ] && git apply -R "$here/row_sums.diff"
  timeout 150 $b > "$out/bench_70b_$variant.txt" 2>&1
  echo "$variant: exit $? ${SECONDS}s" | tee -a "$out/log.txt"
  [ "$variant" = fp32 ] && git apply "$here/row_sums.diff"
  grep -E "triton +│ (bfloat16|fp8_e5m2)" "$out/bench_70b_$variant.txt" | tee -a "$out/log.txt"
done
git status --short kernels | tee -a "$out/log.txt"
