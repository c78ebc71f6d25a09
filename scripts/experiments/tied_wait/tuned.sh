# The tied float loop (blocks.diff) under tuning on first use, one H200: `bench --random-weights --shape
# smollm2-135m --weights q4_1` (bf16 beside it, a fresh tuning folder each) with the step's choice of way before
# ways.diff (each way's fastest launch, one pass, the sweep's winner kept unless another is 0.5% faster: ways.diff
# reverted) and as it is (two passes, the step's fastest kept, the float way's two fastest offered). With the test
# data's file at 1f5cae6 (the tied loop, the one-pass choice) tuning put wo behind a quantize pass and the file
# decoded 6.5% short of bf16 (scripts/results/quant/smollm2_file_h200/1f5cae6/).
#   bash scripts/experiments/tied_wait/tuned.sh OUTDIR
. scripts/experiments/record.sh "$@"
d=scripts/experiments/tied_wait
small=(--random-weights --shape smollm2-135m --weights q4_1)
reverted $d/ways.diff tuned_bench stock 220 "${small[@]}"
tuned_bench ways 220 "${small[@]}"
grep -H -E "^│ triton|tuned" "$out"/bench_*.txt
