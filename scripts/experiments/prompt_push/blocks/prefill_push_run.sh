#!/usr/bin/env bash
# One call on two H200s: SymmComm's prompt sums checked (tests/tp/test_comm.py -m gpu), the host's and the GPU's
# time per call (prompt_sum_host.py), then the whole prompt per block count (scripts/profile_tp_prefill.py,
# 0: torch's two-shot all-reduce), then `bench prefill` (tp_check.sh).
#   bash scripts/experiments/prefill_push_run.sh OUTDIR
set -u
out=${1:?}
mkdir -p "$out"
. scripts/gpu_env.sh || exit 1
export OMP_NUM_THREADS=1
tr="python3 -m torch.distributed.run --standalone --nproc-per-node 2"
t0=$SECONDS
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/tp/test_comm.py > "$out/tests_comm.txt" 2>&1
echo "tests_comm: exit $?, $((SECONDS - t0)) s" | tee -a "$out/log.txt"
t0=$SECONDS
timeout 120 $tr scripts/experiments/prompt_sum_host.py > "$out/prompt_sum_host.txt" 2>&1
echo "prompt_sum_host: exit $?, $((SECONDS - t0)) s" | tee -a "$out/log.txt"
t0=$SECONDS
timeout 200 $tr scripts/profile_tp_prefill.py --shape llama-2-7b --tokens 4000 --chunks 4096 --blocks "${BLOCKS:-0,2,1,2,4}" \
  --out "$out/prefill_blocks_7b.json" > "$out/prefill_blocks_7b.txt" 2>&1
echo "prefill_blocks_7b: exit $?, $((SECONDS - t0)) s" | tee -a "$out/log.txt"
bash scripts/tp_check.sh "$out/check" "${BUDGET:-120}" prefill_7b > "$out/tp_check.txt" 2>&1
