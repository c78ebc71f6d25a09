#!/usr/bin/env bash
# After a 1,000-token prompt in a 4,096-position cache (as `chat` and `serve` hold one): 70B FP8 E5M2 and 13B bf16
# with attention tuned on first use (its split cut picked by sweep_splits) against LLAMAFAST_TUNE=0 (attention's
# default launch, splits of the cache's size; 70B's GEMVs take the H200's committed entries either way, while no
# table holds full 13B's, so its pair also sets tuned GEMVs against their defaults); then 7B FP8 E5M2 with the
# kept merge against ../attention_merge/merge.diff taken out, on the committed tables.
#   bash scripts/experiments/attention_min_split/run_ctx.sh OUTDIR
. scripts/experiments/record.sh "$@"
b="python3 -m llamafast bench --random-weights --backend triton"
ctx="--prompt-len 1000 --context 4096 --new-tokens 128"
for shape in "llama-2-70b --fp8" "llama-2-13b"; do
  name=${shape%% *}
  LLAMAFAST_TUNE_DIR=$out/tune timeout 100 $b --shape $shape $ctx > "$out/${name}_tuned.txt" 2>&1
  logged "$name tuned" $?
  LLAMAFAST_TUNE=0 timeout 100 $b --shape $shape $ctx > "$out/${name}_untuned.txt" 2>&1
  logged "$name untuned" $?
done
grep -h "│ triton" "$out"/*tuned.txt | tee -a "$out/log.txt"
cp "$out"/tune/NVIDIA*.json "$out/tuned_launches.json" && rm -rf "$out/tune"
LLAMAFAST_TUNE=0 reverted scripts/experiments/attention_merge/merge.diff timeout 60 $b --shape llama-2-7b --fp8 \
  > "$out/7b_old.txt" 2>&1
logged "7b old" $?
grep -h "│ triton" "$out"/7b_old.txt | tee -a "$out/log.txt"
