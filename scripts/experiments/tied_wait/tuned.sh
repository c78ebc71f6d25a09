# The tied float loop (blocks.diff) under tuning on first use, one H200: `bench --random-weights --shape
# smollm2-135m --weights q4_1` (bf16 beside it) tunes its launches, then small_floats/ab.py times bf16 and Q4_1 on
# the launches it tuned (tuned.json) and on launches_h200.json (every GEMV but QKV on float activations), each with
# QKV on float activations too, each in its own process. With the test data's file (h200_file/, at 1f5cae6, the
# tied loop committed) tuning put wo after a quantize pass, and the file decoded 6.5% short of bf16.
#   bash scripts/experiments/tied_wait/tuned.sh OUTDIR
. scripts/experiments/record.sh "$@"
d=scripts/experiments/tied_wait
git apply $d/blocks.diff || exit 1
rm -rf ~/.triton/llamafast
timeout 300 python3 -m llamafast bench --random-weights --shape smollm2-135m --weights q4_1 --backend triton \
  > "$out/bench_smollm2_q4_1.txt" 2>&1
logged bench $?
cp ~/.triton/llamafast/NVIDIA*.json "$out/tuned.json"
LLAMAFAST_TUNE=0 timeout 90 python3 scripts/experiments/small_floats/ab.py --launches "$out/tuned.json" \
  > "$out/ab_tuned.txt" 2>&1
logged ab_tuned $?
LLAMAFAST_TUNE=0 timeout 90 python3 scripts/experiments/small_floats/ab.py > "$out/ab_fixed.txt" 2>&1
logged ab_fixed $?
git apply -R $d/blocks.diff
grep -E "^│ triton" "$out/bench_smollm2_q4_1.txt"
grep -H ms/token "$out"/ab_*.txt
