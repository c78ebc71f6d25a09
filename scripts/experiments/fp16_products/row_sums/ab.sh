#!/usr/bin/env bash
# One call on one H200: 7B FP8 E5M2 decode with the GEMVs' fp16 products summed into fp32 row sums every 8
# tiles (this tree: gemv_half.py) and with fp32 products (row_sums.diff reverted), each bench in its own process,
# alternated twice; `bench kernels --fp8` (each kernel alone) of both; then this tree's E5M2 GEMV tests on the GPU.
# Lost on one H200 at 8ed0f8f: 7B FP8 443.8 / 443.4 tok/s against 463.6 / 463.3 (bf16 288.9 beside each), on the
# committed launches; each kernel alone faster (kernels_*.txt: the five 205.5 against 214.2 µs); 76 GPU tests
# passed (log.txt). To repeat: `git apply scripts/experiments/fp16_products/row_sums/row_sums.diff` at 8ed0f8f, then
#   bash scripts/experiments/fp16_products/row_sums/ab.sh OUTDIR
set -u
out=${1:?}
mkdir -p "$out"
. scripts/gpu_env.sh || exit 1
here=scripts/experiments/fp16_products/row_sums
SECONDS=0
b="python3 -m llamafast bench --random-weights --fp8 --backend triton --shape llama-2-7b"
for round in 1 2; do
  for variant in fp16 fp32; do
    [ "$variant" = fp32 ] && git apply -R "$here/row_sums.diff"
    timeout 60 $b > "$out/bench_${variant}_$round.txt" 2>&1
    echo "$variant $round: exit $? ${SECONDS}s" | tee -a "$out/log.txt"
    [ "$round" = 2 ] && timeout 60 python3 -m llamafast bench kernels --fp8 > "$out/kernels_$variant.txt" 2>&1
    [ "$variant" = fp32 ] && git apply "$here/row_sums.diff"
    grep -E "triton +│ (bfloat16|fp8_e5m2)" "$out/bench_${variant}_$round.txt" | tee -a "$out/log.txt"
  done
done
git status --short kernels | tee -a "$out/log.txt"
timeout 200 python3 -m pytest -q -m gpu tests/kernels/test_gemv.py tests/kernels/test_rmsnorm_qkv_rope.py \
  -k "e5m2 or own_launches" -p no:cacheprovider > "$out/tests.txt" 2>&1
echo "tests: exit $? ${SECONDS}s" | tee -a "$out/log.txt"
tail -3 "$out/tests.txt" | tee -a "$out/log.txt"
