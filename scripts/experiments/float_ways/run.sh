# Tuning on first use with float and FP8 GEMVs chosen by the step (new) against the rule before it (old: only block
# GEMVs' ways; old_rule.py), alternating, each run tuning Llama-2-13B (no committed single-GPU entries) into a fresh
# folder, bf16 and FP8 E5M2 decode beside each other. The Triton cache is shared: the first run compiles on a cold one.
#   bash scripts/experiments/float_ways/run.sh OUTDIR [RUNS...]   (RUNS: new_1 old_1 new_2 old_2, the default)
set -u
out=$1; shift; mkdir -p "$out"
. scripts/gpu_env.sh || exit 1
bench="bench --random-weights --shape llama-2-13b --fp8 --backend triton"
for r in ${@:-new_1 old_1 new_2 old_2}; do
  export LLAMAFAST_TUNE_DIR=/tmp/float_ways_$r
  rm -rf "$LLAMAFAST_TUNE_DIR"
  if [ "${r%_*}" = new ]; then cmd="python3 -m llamafast"; else cmd="python3 scripts/experiments/float_ways/old_rule.py"; fi
  echo "# $cmd $bench  (LLAMAFAST_TUNE_DIR fresh)" > "$out/$r.txt"
  timeout ${RUN_LIMIT:-150} $cmd $bench >> "$out/$r.txt" 2>&1
  echo "$r: exit $? ${SECONDS}s" | tee -a "$out/log.txt"
  echo "# the tuning file" >> "$out/$r.txt"
  cat "$LLAMAFAST_TUNE_DIR"/*/*.json "$LLAMAFAST_TUNE_DIR"/*.json >> "$out/$r.txt" 2>/dev/null
done
