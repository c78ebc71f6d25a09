# SmolLM2-135M's shape, bf16 beside Q4_1 layers with a Q8_0 LM head (the test data's file's formats): the step's
# kernels in place (timeline), then decode tok/s, with launches tuned on first use.
#   bash scripts/experiments/small_timeline/run.sh OUTDIR [SHAPE] [WEIGHTS]
# h200/: the tree of 760d6c3, before the Q4 bytes were loaded 8 at a time.
. scripts/experiments/record.sh "$@"
shape=${2:-smollm2-135m}; weights=${3:-q4_1}
export LLAMAFAST_TUNE_DIR=$out/tune
llamafast bench timeline --random-weights --shape "$shape" --weights "$weights" --reps 20 \
  --out "$out/timeline_$shape.json" > "$out/timeline_$shape.txt" 2>&1
logged timeline $?
llamafast bench --random-weights --shape "$shape" --backend triton --weights "$weights" \
  --out "$out/bench_$shape.json" > "$out/bench_$shape.txt" 2>&1
logged bench $?
tail -8 "$out/bench_$shape.txt"
