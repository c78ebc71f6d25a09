# Tuning on first use with the sweep's candidates compiled ahead on worker processes (llamafast/tuning/compiling.py)
# against compiled one by one at their first launch (serial.diff applied), on one GPU: the tuning GPU tests, then
# `bench --random-weights --shape llama-2-7b --weights q4_k`, each RUN in a fresh Triton cache and tuning folder, in
# the order given (ahead* as committed, serial* with the diff).
#   bash scripts/experiments/compile_ahead/run.sh OUTDIR RUN...   e.g. ahead_1 serial_1 ahead_2
. scripts/experiments/record.sh "$@"
d=scripts/experiments/compile_ahead
shift
model=(--random-weights --shape llama-2-7b --weights q4_k)
python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/engine -k "tuning or tunes" > "$out/tests.txt" 2>&1
logged tests $?
tail -1 "$out/tests.txt"
cold() { TRITON_CACHE_DIR=$out/triton_$1 tuned_bench "$@"; rm -rf "$out/triton_$1"; }
for run in "$@"; do
  case $run in
    ahead*) cold "$run" 280 "${model[@]}" ;;
    serial*) applied $d/serial.diff cold "$run" 280 "${model[@]}" ;;
    *) echo "run names start with ahead or serial: $run" >&2 ;;
  esac
done
nproc > "$out/nproc.txt"
grep -H -E "^│ triton|tuned" "$out"/bench_*.txt
