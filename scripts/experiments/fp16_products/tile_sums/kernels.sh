#!/usr/bin/env bash
# One call on one H200: `bench kernels --fp8` (each 7B decode kernel alone, in CUDA graphs) with the fp16
# products (this tree) and with fp32 products (tile_sums.diff reverted), each in its own process.
# Every FP8 GEMV alone slower (kernels_fp16.txt against kernels_fp32.txt): the five 243.4 against 215.3 µs.
# To repeat: apply tile_sums.diff at 8ed0f8f, then
#   bash scripts/experiments/fp16_products/tile_sums/kernels.sh OUTDIR
set -u
out=${1:?}
mkdir -p "$out"
. scripts/gpu_env.sh || exit 1
here=scripts/experiments/fp16_products/tile_sums
SECONDS=0
for variant in fp16 fp32; do
  [ "$variant" = fp32 ] && git apply -R "$here/tile_sums.diff"
  timeout 120 python3 -m llamafast bench kernels --fp8 --shape llama-2-7b > "$out/kernels_$variant.txt" 2>&1
  echo "$variant: exit $? ${SECONDS}s" | tee -a "$out/log.txt"
  [ "$variant" = fp32 ] && git apply "$here/tile_sums.diff"
done
git diff --stat | tee -a "$out/log.txt"
