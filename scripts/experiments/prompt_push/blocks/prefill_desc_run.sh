#!/usr/bin/env bash
# One call on two H200s: prompt_sum_host.py and scripts/profile_tp_prefill.py with host-built TMA descriptors
# (the committed rule: from 1,024 rows) and with every matmul's built on the device.
#   bash scripts/experiments/prefill_desc_run.sh OUTDIR
set -u
out=${1:?}
mkdir -p "$out"
. scripts/gpu_env.sh || exit 1
export OMP_NUM_THREADS=1
tr="python3 -m torch.distributed.run --standalone --nproc-per-node 2"
for mode in host device; do
  flag=$([ $mode = device ] && echo --device-descriptors)
  t0=$SECONDS
  timeout 120 $tr scripts/experiments/prompt_sum_host.py $flag > "$out/prompt_sum_host_$mode.txt" 2>&1
  echo "prompt_sum_host $mode: exit $?, $((SECONDS - t0)) s" | tee -a "$out/log.txt"
  t0=$SECONDS
  timeout 200 $tr scripts/profile_tp_prefill.py --shape llama-2-7b --tokens 4000 --chunks 4096 --blocks 0,2,2,4 \
    $flag --out "$out/prefill_blocks_7b_$mode.json" > "$out/prefill_blocks_7b_$mode.txt" 2>&1
  echo "prefill_blocks_7b $mode: exit $?, $((SECONDS - t0)) s" | tee -a "$out/log.txt"
done
