#!/usr/bin/env bash
# The kept merge (merge.diff: one load for every split where they fit, its splits a load capped at the grid's):
# its GPU tests; `bench` beside the merge one head after another (merge.diff taken out) on the committed tables
# and kernel defaults (LLAMAFAST_TUNE=0), SmolLM2's shape and 7B FP8 E5M2, alternated; then SmolLM2's shape in
# bf16 and beside it Q4_1, launches tuned on first use, in one bench run.
#   bash scripts/experiments/attention_merge/run2.sh OUTDIR
. scripts/experiments/record.sh "$@"
diff=scripts/experiments/attention_merge/merge.diff
timeout 220 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_decode_attention.py \
  tests/kernels/test_decode_step.py > "$out/tests.txt" 2>&1
logged "tests" $?
tail -1 "$out/tests.txt" | tee -a "$out/log.txt"
b="python3 -m llamafast bench --random-weights --backend triton"
for shape in smollm2-135m "llama-2-7b --fp8"; do
  name=${shape%% *}
  LLAMAFAST_TUNE=0 $b --shape $shape > "$out/${name}_new.txt" 2>&1
  logged "$name new" $?
  LLAMAFAST_TUNE=0 reverted $diff $b --shape $shape > "$out/${name}_old.txt" 2>&1
  logged "$name old" $?
done
grep -h "│ triton" "$out"/*_new.txt "$out"/*_old.txt | tee -a "$out/log.txt"
LLAMAFAST_TUNE_DIR=$out/tune timeout $((470 - SECONDS)) $b --shape smollm2-135m --weights q4_1 \
  --out "$out/bench_smollm2_q4_1.json" > "$out/bench_smollm2_q4_1.txt" 2>&1
logged "smollm2 tuned" $?
tail -8 "$out/bench_smollm2_q4_1.txt" | tee -a "$out/log.txt"
