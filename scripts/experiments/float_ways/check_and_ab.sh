# One device call: the whole gpu test suite (6 workers, to leave time), then run.sh's A/B in what is left of the
# call's CALL_LIMIT seconds (default 585), as many runs as fit (new_1 old_1 new_2 old_2). TESTS: the gpu tests'
# paths instead of tests/ (a call short of time: tests/engine); AB_SECONDS: the seconds the tests leave the A/B (200).
#   GPU_CHECK_COMMIT=<sha> [CALL_LIMIT=S] [TESTS=PATHS] bash scripts/experiments/float_ways/check_and_ab.sh OUTDIR
set -u
out=$1; mkdir -p "$out"
. scripts/gpu_env.sh || exit 1
{ echo "commit ${GPU_CHECK_COMMIT:-unknown}"; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc; } > "$out/log.txt"
limit=${CALL_LIMIT:-585}
timeout $((limit - ${AB_SECONDS:-200})) python3 -m pytest -q -m gpu -p no:cacheprovider -n 6 --dist loadfile -rfE ${TESTS:-tests} > "$out/tests.txt" 2>&1
echo "gpu tests: exit $? ${SECONDS}s: $(tail -1 "$out/tests.txt")" | tee -a "$out/log.txt"
for r in new_1 old_1 new_2 old_2; do
  [ $SECONDS -lt $((limit - 100)) ] || break
  RUN_LIMIT=$((limit - SECONDS)) bash scripts/experiments/float_ways/run.sh "$out" "$r" > /dev/null
done
cat "$out/log.txt"
