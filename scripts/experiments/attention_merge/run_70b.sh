#!/usr/bin/env bash
# As run.sh, with merge.diff's splits a load capped at the grid's: 7B bf16 and FP8 E5M2 once a way, then
# Llama-2-70B FP8 E5M2 on the committed tables (the H200's) and attention's default launch, the merge over every
# head at once, then one head after another (merge.diff taken out), alternated while the call has time.
#   bash scripts/experiments/attention_merge/run_70b.sh OUTDIR
. scripts/experiments/record.sh "$@"
diff=scripts/experiments/attention_merge/merge.diff
export LLAMAFAST_TUNE=0
b="python3 -m llamafast bench --random-weights --backend triton"
$b --shape llama-2-7b --fp8 > "$out/7b_new.txt" 2>&1
logged "7b new" $?
reverted $diff $b --shape llama-2-7b --fp8 > "$out/7b_old.txt" 2>&1
logged "7b old" $?
b="$b --shape llama-2-70b --fp8 --new-tokens 128"
for rep in 1 2; do
  [ $SECONDS -lt 300 ] || break
  timeout 130 $b > "$out/70b_new_$rep.txt" 2>&1
  logged "70b new $rep" $?
  reverted $diff timeout 130 $b > "$out/70b_old_$rep.txt" 2>&1
  logged "70b old $rep" $?
done
grep -h "│ triton" "$out"/7b_*.txt "$out"/70b_*.txt | tee -a "$out/log.txt"
