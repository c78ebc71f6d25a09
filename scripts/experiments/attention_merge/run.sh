#!/usr/bin/env bash
# The merge of a KV head's splits over every head of its group at once (merge.diff) against one head after
# another (the diff taken out): its GPU tests, attention alone at each length (../attention_min_split/alone.py),
# then `bench` in one process per way, each way twice, alternated, on the committed tables and kernel defaults
# (LLAMAFAST_TUNE=0, so both ways take the same launches): SmolLM2's shape in bf16, 7B FP8 E5M2.
#   bash scripts/experiments/attention_merge/run.sh OUTDIR
. scripts/experiments/record.sh "$@"
diff=scripts/experiments/attention_merge/merge.diff
timeout 220 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_decode_attention.py \
  tests/kernels/test_decode_step.py > "$out/tests.txt" 2>&1
logged "tests" $?
tail -1 "$out/tests.txt" | tee -a "$out/log.txt"
export LLAMAFAST_TUNE_DIR=$out/tune
timeout 90 python3 scripts/experiments/attention_min_split/alone.py llama-2-70b smollm2-135m llama-2-7b \
  > "$out/alone.txt" 2>&1
logged alone $?
export LLAMAFAST_TUNE=0
b="python3 -m llamafast bench --random-weights --backend triton"
for rep in 1 2; do
  $b --shape smollm2-135m > "$out/smollm2_new_$rep.txt" 2>&1
  logged "smollm2 new $rep" $?
  reverted $diff $b --shape smollm2-135m > "$out/smollm2_old_$rep.txt" 2>&1
  logged "smollm2 old $rep" $?
done
for rep in 1 2; do
  $b --shape llama-2-7b --fp8 > "$out/7b_new_$rep.txt" 2>&1
  logged "7b new $rep" $?
  reverted $diff $b --shape llama-2-7b --fp8 > "$out/7b_old_$rep.txt" 2>&1
  logged "7b old $rep" $?
done
grep -h "│ triton" "$out"/smollm2_*.txt "$out"/7b_*.txt | tee -a "$out/log.txt"
