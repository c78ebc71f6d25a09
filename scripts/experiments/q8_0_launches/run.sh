# Block GEMVs' launches chosen in the decode step (steps.diff: each block GEMV's two fastest launches of each way,
# timed in the graphed step in two passes, at every K) against the committed choice (the step times ways only
# where float activations were swept, K at most 2,048), one H200: `bench --random-weights --shape SHAPE` in Q8_0,
# Q4_0 and Q4_K (llama-2-7b) or Q4_1 (any other shape), or WEIGHTS, bf16 beside them, tuned from scratch in a fresh
# folder for each RUN: stock* as committed, steps* with steps.diff applied, in the order given (alternate them: a
# sweep's winners differ from run to run, README.md).
#   [WEIGHTS=q8_0] bash scripts/experiments/q8_0_launches/run.sh OUTDIR SHAPE RUN...   e.g. llama-2-7b stock_1 steps_1
. scripts/experiments/record.sh "$@"
d=scripts/experiments/q8_0_launches
shape=${2:?usage: run.sh OUTDIR SHAPE RUN...}
shift 2
weights=q4_1
[ "$shape" = llama-2-7b ] && weights=q8_0,q4_0,q4_k
model=(--random-weights --shape "$shape" --weights "${WEIGHTS:-$weights}")
for run in "$@"; do
  case $run in
    stock*) tuned_bench "$shape-$run" 280 "${model[@]}" ;;
    steps*) applied $d/steps.diff tuned_bench "$shape-$run" 280 "${model[@]}" ;;
    *) echo "run names start with stock or steps: $run" >&2 ;;
  esac
done
grep -H -E "^│ triton|tuned" "$out"/bench_*.txt
