#!/usr/bin/env bash
# One call on one H200: the 7B FP8 E5M2 GEMV launches walked again under PDL with the fp16 products (this tree),
# then, with row_sums.diff reverted (fp32 products), the H200 tables against the committed ones (--ab), so the
# walk's step times stand beside the fp32 loop's in the same call.
# The walk's chosen launches 2.1143-2.1164 ms/token (walk_fp16.txt) against the fp32 loop on its H200 launches
# 2.1182-2.1189 (ab_fp32.txt): 0.1%, within the walk's noise. To repeat: apply row_sums.diff at 8ed0f8f, then
#   bash scripts/experiments/fp16_products/row_sums/walk.sh OUTDIR
set -u
out=${1:?}
mkdir -p "$out"
. scripts/gpu_env.sh || exit 1
here=scripts/experiments/fp16_products/row_sums
SECONDS=0
w="python3 scripts/experiments/step_launches.py --shape llama-2-7b --weights fp8_e5m2 --steps 100 --pdl"
timeout 330 $w --grids quick full > "$out/walk_fp16.txt" 2>&1
echo "walk fp16: exit $? ${SECONDS}s" | tee -a "$out/log.txt"
git apply -R "$here/row_sums.diff"
timeout 90 $w --ab > "$out/ab_fp32.txt" 2>&1
echo "ab fp32: exit $? ${SECONDS}s" | tee -a "$out/log.txt"
git apply "$here/row_sums.diff"
git status --short kernels | tee -a "$out/log.txt"
