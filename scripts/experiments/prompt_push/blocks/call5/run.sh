#!/usr/bin/env bash
# One call on two H200s, the tree that keeps copy-engine blocks: the prefill kernels' and the launcher's GPU tests,
# SymmComm's prompt sums (tests/tp/test_comm.py), the prompt per block count beside the two-shot all-reduce
# (0), nccl, the floor and TP=1 (scripts/profile_tp_prefill.py), then tp_check.sh's tests_tp and prefill_7b.
#   bash scripts/experiments/prompt_push/blocks/call5/run.sh OUTDIR
set -u
out=${1:?}
mkdir -p "$out"
. scripts/gpu_env.sh || exit 1
export OMP_NUM_THREADS=1
t0=$SECONDS
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/kernels/test_launcher.py \
  tests/kernels/test_prefill.py tests/tp/test_comm.py > "$out/tests_gpu.txt" 2>&1
echo "tests_gpu: exit $?, $((SECONDS - t0)) s" | tee -a "$out/log.txt"
t0=$SECONDS
timeout 200 python3 -m torch.distributed.run --standalone --nproc-per-node 2 scripts/profile_tp_prefill.py \
  --shape llama-2-7b --tokens 4000 --chunks 4096 --blocks 0,2,1,2,4,2,0 --out "$out/prefill_blocks_7b.json" \
  > "$out/prefill_blocks_7b.txt" 2>&1
echo "prefill_blocks_7b: exit $?, $((SECONDS - t0)) s" | tee -a "$out/log.txt"
bash scripts/tp_check.sh "$out/check" "${BUDGET:-300}" tests_tp prefill_7b > "$out/tp_check.txt" 2>&1
