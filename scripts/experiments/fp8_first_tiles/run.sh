#!/usr/bin/env bash
# One call on one H200: FP8 GEMVs under programmatic dependent launch reading their first two tiles before the
# wait (kernels.diff applied, as at 28a010d) against one (kernels.diff reverted), `bench --fp8` alternated twice,
# each in its own process; then the GPU check of the tree with the diff.
#   git apply scripts/experiments/fp8_first_tiles/kernels.diff
#   GPU_CHECK_COMMIT=<sha> bash scripts/experiments/fp8_first_tiles/run.sh OUTDIR
set -u
out=${1:?}
mkdir -p "$out"
. scripts/gpu_env.sh || exit 1
here=scripts/experiments/fp8_first_tiles
for rep in 1 2; do
  for variant in two one; do
    [ "$variant" = one ] && git apply -R "$here/kernels.diff"
    timeout 90 python3 -m llamafast bench --random-weights --shape llama-2-7b --fp8 --backend triton \
      > "$out/bench_${variant}_$rep.txt" 2>&1
    echo "bench $variant $rep: exit $?" | tee -a "$out/log.txt"
    [ "$variant" = one ] && git apply "$here/kernels.diff"
    grep -E "triton +│ (bfloat16|fp8_e5m2)" "$out/bench_${variant}_$rep.txt" | tee -a "$out/log.txt"
  done
done
timeout 400 bash scripts/gpu_check.sh "$out/gc"
echo "gpu_check: exit $?" | tee -a "$out/log.txt"
