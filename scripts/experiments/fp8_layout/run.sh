#!/usr/bin/env bash
# One call on one H200: FP8 weight tiles loaded 8 bytes a thread, in the layout of the bf16 activations they
# multiply (kernels.diff applied), against 16 bytes a thread, which Triton meets with a shared-memory round trip
# of x and two barriers in every loop step (kernels.diff reverted): `bench --fp8` alternated twice, each in its
# own process; then the whole-step walk of FP8 launches on the new tiles (step_launches.py --grids quick --pdl).
# At 8b5b28f, with the H200's launches of that time, the tiles alone changed nothing: 449.2 / 448.9 tok/s against
# 448.9 / 449.0; the walk found launches that now win (walk_7b_quick.txt).
#   bash scripts/experiments/fp8_layout/run.sh OUTDIR [WALK_SECONDS]
# (its outputs here: narrow_wide_log.txt, bench_{narrow,wide}_[12].txt, walk_7b_quick.txt)
set -u
out=${1:?}; walk=${2:-200}
mkdir -p "$out"
. scripts/gpu_env.sh || exit 1
here=scripts/experiments/fp8_layout
for rep in 1 2; do
  for variant in narrow wide; do
    [ "$variant" = wide ] && git apply -R "$here/kernels.diff"
    timeout 100 python3 -m llamafast bench --random-weights --shape llama-2-7b --fp8 --backend triton \
      > "$out/bench_${variant}_$rep.txt" 2>&1
    echo "bench $variant $rep: exit $? ${SECONDS}s" | tee -a "$out/log.txt"
    [ "$variant" = wide ] && git apply "$here/kernels.diff"
    grep -E "triton +│ (bfloat16|fp8_e5m2)" "$out/bench_${variant}_$rep.txt" | tee -a "$out/log.txt"
  done
done
echo "# python scripts/experiments/step_launches.py --shape llama-2-7b --weights fp8_e5m2 --steps 100" \
  "--grids quick --pdl" > "$out/walk.txt"
timeout "$walk" python3 scripts/experiments/step_launches.py --shape llama-2-7b --weights fp8_e5m2 --steps 100 \
  --grids quick --pdl >> "$out/walk.txt" 2>&1
echo "walk: exit $? ${SECONDS}s" | tee -a "$out/log.txt"
