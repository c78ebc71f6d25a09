#!/usr/bin/env bash
# The tensor-parallel persistent step on one GPU, in one call: its GPU tests (ranks simulated in one process; two
# at once on two streams), then rank 0's 7B floor (profile_tp.py --world 2: the shard with no communication,
# beside TP=1 on the same backend) on the persistent step and on the per-op graph.
#   bash scripts/results/tp_step/run.sh OUTDIR
set -uo pipefail
out=${1:?usage: run.sh OUTDIR}
mkdir -p "$out"
. scripts/gpu_env.sh || exit 1
left() { echo $((570 - SECONDS)); }
timeout 250 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE -s tests/kernels/test_decode_step_tp.py \
  tests/kernels/test_tp_sync.py > "$out/tests.txt" 2>&1
echo "tests rc=$? at ${SECONDS}s: $(tail -1 "$out/tests.txt")" | tee -a "$out/log.txt"
for b in persistent triton; do
  timeout "$(left)" python3 scripts/profile_tp.py --world 2 --shape llama-2-7b --backend $b \
    --out "$out/floor_7b_$b.json" > "$out/floor_7b_$b.txt" 2>&1
  echo "floor $b rc=$? at ${SECONDS}s" | tee -a "$out/log.txt"
  tail -3 "$out/floor_7b_$b.txt"
done
