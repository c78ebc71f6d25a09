#!/usr/bin/env bash
# The GPU tests of the code the tensor-parallel persistent step changed, for a call too short for the whole GPU
# check: the step's own tests (printing their errors), then the per-op TP kernels, the one-GPU persistent step, the
# GEMVs and RMSNorm + QKV, whose loops it touched.
#   bash scripts/results/tp_step/gpu_subset.sh OUTDIR
set -uo pipefail
out=${1:?usage: gpu_subset.sh OUTDIR}
mkdir -p "$out"
. scripts/gpu_env.sh || exit 1
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE -s tests/kernels/test_decode_step_tp.py \
  > "$out/tests_tp_step.txt" 2>&1
echo "tp step rc=$? at ${SECONDS}s: $(tail -1 "$out/tests_tp_step.txt")" | tee -a "$out/log.txt"
workers=$(python3 -c "import xdist" 2>/dev/null && echo "-n 4 --dist loadfile")
# shellcheck disable=SC2086
timeout $((240 - SECONDS)) python3 -m pytest -q -m gpu -p no:cacheprovider $workers -rfE tests/kernels/test_tp_sync.py \
  tests/kernels/test_decode_step.py tests/kernels/test_gemv.py tests/kernels/test_rmsnorm_qkv_rope.py \
  > "$out/tests_touched.txt" 2>&1
echo "touched rc=$? at ${SECONDS}s: $(tail -1 "$out/tests_touched.txt")" | tee -a "$out/log.txt"
