#!/usr/bin/env bash
# One call on one H200: the FP8 decode of 70B and 7B with the 8-byte FP8 tiles and their walked H200 launches
# (this tree) and without them (since_bdf4a14.diff reverted: the kernels as at bdf4a14), each bench in its own
# process, the 70B pair first.
#   bash scripts/experiments/fp8_layout/before_after.sh OUTDIR
# (its outputs here: before_after_log.txt, bench_7b_*.txt, bench_70b_*.txt)
. scripts/experiments/record.sh "$@"
diff=scripts/experiments/fp8_layout/since_bdf4a14.diff
b="python3 -m llamafast bench --random-weights --fp8 --backend triton"
for shape in 70b 7b; do
  for variant in after before; do
    as=""
    [ "$variant" = before ] && as="reverted $diff"
    if [ "$shape" = 70b ]; then
      $as timeout 110 $b --shape llama-2-70b --new-tokens 128 > "$out/bench_${shape}_$variant.txt" 2>&1
    else
      $as timeout 40 $b --shape llama-2-7b > "$out/bench_${shape}_$variant.txt" 2>&1
    fi
    logged "$shape $variant" $?
    grep -E "triton +│ (bfloat16|fp8_e5m2)" "$out/bench_${shape}_$variant.txt" | tee -a "$out/log.txt"
  done
done
