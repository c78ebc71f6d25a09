#!/usr/bin/env bash
# A/B of how the device-side waits poll (kernels/counters.py), one process per way, each with its own baseline:
#   0: every poll an acquire load, every ticket an acq_rel atomic (each an L1 invalidation, CCTL.IVALL, in SASS);
#   2: relaxed polls, then one acquire load once the count is reached; release tickets, the last program fencing.
#   bash scripts/experiments/poll_ab.sh tp OUT          # two GPUs: per-point costs at 7B, 13B, 70B; the sync tests
#   bash scripts/experiments/poll_ab.sh persistent OUT  # one GPU: 7B bf16 and FP8 decode, persistent beside per-op
set -uo pipefail
cd "$(dirname "$0")/../.."
what=${1:?tp or persistent} out=${2:?OUT}
mkdir -p "$out"
. scripts/gpu_env.sh || exit 1
export OMP_NUM_THREADS=1

run() {  # NAME LIMIT MODE COMMAND...
  local name=$1 limit=$2 mode=$3 t0=$SECONDS
  shift 3
  LLAMAFAST_EXP_POLL=$mode TRITON_CACHE_DIR=/tmp/tc$mode timeout "$limit" "$@" > "$out/$name.txt" 2>&1
  echo "== $name: exit $?, $((SECONDS - t0)) s" | tee -a "$out/log.txt"
}

if [ "$what" = tp ]; then
  tr="python3 -m torch.distributed.run --standalone --nproc-per-node 2"
  run tests_sync 90 2 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/kernels/test_tp_sync.py
  for s in 7b 13b 70b; do
    for m in 2 0; do
      run "profile_${s}_poll$m" 120 $m $tr scripts/profile_tp.py --shape "llama-2-$s" --out "$out/profile_${s}_poll$m.json"
    done
  done
  run tests_tp 120 2 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/tp/test_tp_run.py -k symm
else
  for m in 2 0; do
    run "decode_7b_poll$m" 200 $m python3 -m llamafast bench --random-weights --shape llama-2-7b --fp8 \
      --out "$out/decode_7b_poll$m.json"
  done
  run tests_step 200 2 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/kernels/test_decode_step.py
fi
for f in "$out"/*.txt; do echo "-- $(basename "$f")"; grep -E "ms/token|tok/s|passed|failed|rror" "$f" | tail -12; done
