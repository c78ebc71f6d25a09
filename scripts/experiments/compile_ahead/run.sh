# Tuning on first use with the sweep's candidates compiled ahead on worker processes (ahead.diff: tuning/compiling.py,
# with every kernel's cache key settled at import, kernels/_common.settle_cache_keys) against compiled one by one at
# their first launch (the tree as committed), on one GPU: key_order.py and the tuning tests with the diff applied,
# then `bench --random-weights --shape llama-2-7b --weights q4_k`, each RUN in a fresh Triton cache and tuning
# folder, in the order given (ahead* with the diff, serial* without).
#   bash scripts/experiments/compile_ahead/run.sh OUTDIR RUN...   e.g. ahead_1 serial_1 ahead_2
. scripts/experiments/record.sh "$@"
d=scripts/experiments/compile_ahead
shift
model=(--random-weights --shape llama-2-7b --weights q4_k)
tests() {  # fails where either pytest run fails
  local rc=0
  python3 $d/key_order.py > "$out/key_order.txt" 2>&1
  python3 -m pytest -q -p no:cacheprovider -rfE tests/engine/test_tuning_compile.py tests/kernels/test_cache_keys.py \
    > "$out/tests.txt" 2>&1 || rc=1
  python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/engine -k "tuning or tunes" >> "$out/tests.txt" 2>&1 \
    || rc=1
  return $rc
}
applied $d/ahead.diff tests
logged tests $?
grep -E "passed|failed" "$out/tests.txt"
cold() { TRITON_CACHE_DIR=$out/triton_$1 tuned_bench "$@"; rm -rf "$out/triton_$1"; }
for run in "$@"; do
  case $run in
    ahead*) applied $d/ahead.diff cold "$run" 280 "${model[@]}" ;;
    serial*) cold "$run" 280 "${model[@]}" ;;
    *) echo "run names start with ahead or serial: $run" >&2 ;;
  esac
done
nproc > "$out/nproc.txt"
grep -H -E "^│ triton|tuned" "$out"/bench_*.txt
