# k_scales.diff (the K-quants' scale loads hinted into their block sums' layout) on one GPU: the K-quant GPU tests
# with it applied, then `bench --random-weights --shape llama-2-7b --weights q4_k,q4_k_m` tuned from scratch in a
# fresh folder for each RUN, in the order given: stock* as committed, hinted* with the diff applied (alternate
# them: a sweep's winners differ from run to run, scripts/experiments/q8_0_launches/). Each tuning folder's file
# holds its GEMVs' sweep times, kernel by kernel.
#   bash scripts/experiments/block_sass/run.sh OUTDIR RUN...   e.g. stock_1 hinted_1 hinted_2 stock_2
. scripts/experiments/record.sh "$@"
d=scripts/experiments/block_sass
shift
model=(--random-weights --shape llama-2-7b --weights q4_k,q4_k_m)
tests() {
  python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/kernels tests/engine \
    -k "q4_k or q5_k or q6_k or Q4_K or Q5_K or Q6_K or kquant or k_quant or q4_k_m" > "$out/tests.txt" 2>&1
}
if [ "${TESTS:-1}" != 0 ]; then  # TESTS=0 leaves the GPU tests out (a second call's runs)
  applied $d/k_scales.diff tests
  logged tests $?
  tail -1 "$out/tests.txt"
fi
for run in "$@"; do
  case $run in
    stock*) tuned_bench "$run" 280 "${model[@]}" ;;
    hinted*) applied $d/k_scales.diff tuned_bench "$run" 280 "${model[@]}" ;;
    *) echo "run names start with stock or hinted: $run" >&2 ;;
  esac
done
grep -H -E "^│ triton|tuned" "$out"/bench_*.txt
