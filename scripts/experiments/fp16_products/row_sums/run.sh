#!/usr/bin/env bash
# E5M2 products in packed fp16, summed into fp32 row sums every 8 tiles (row_sums.diff: gemv_half.py), against
# fp32 products (the diff reverted), on one H200, a call a stage, each variant in its own process. Run at 8ed0f8f
# with the diff applied (`git apply scripts/experiments/fp16_products/row_sums/row_sums.diff`):
#   bash scripts/experiments/fp16_products/row_sums/run.sh OUTDIR ab|walk|70b
# Each stage's log.txt is kept here as log_<stage>.txt. Lost, and taken out:
# ab: 7B FP8 decode alternated twice, 443.8 / 443.4 tok/s against 463.6 / 463.3 (bf16 288.9 beside each) on the
#   committed launches; `bench kernels --fp8`, each kernel alone, faster (kernels_*.txt: the five 205.5 against
#   214.2 µs); then the E5M2 GEMV tests on the GPU: 76 passed.
# walk: 7B's FP8 launches walked again under PDL with fp16 products, chosen 2.1143-2.1164 ms/token
#   (walk_fp16.txt), against the fp32 loop on its H200 launches (--ab), 2.1182-2.1189 (ab_fp32.txt): 0.1%,
#   within the walk's noise.
# 70b: 70B FP8 decode on the committed H200 launches, 50.2 against 52.3 tok/s (bench_70b_*.txt).
. scripts/experiments/record.sh "$@"
diff=scripts/experiments/fp16_products/row_sums/row_sums.diff
bench="python3 -m llamafast bench --random-weights --fp8 --backend triton"
rows() { grep -E "triton +│ (bfloat16|fp8_e5m2)" "$1" | tee -a "$out/log.txt"; }
as() { [ "$1" = fp32 ] && echo "reverted $diff"; }  # the words that run a command as the variant
case ${2:?stage: ab, walk or 70b} in
  ab)
    for round in 1 2; do
      for v in fp16 fp32; do
        $(as $v) timeout 60 $bench --shape llama-2-7b > "$out/bench_${v}_$round.txt" 2>&1
        logged "$v $round" $?
        [ "$round" = 2 ] && $(as $v) timeout 60 python3 -m llamafast bench kernels --fp8 > "$out/kernels_$v.txt" 2>&1
        rows "$out/bench_${v}_$round.txt"
      done
    done
    git status --short kernels | tee -a "$out/log.txt"
    timeout 200 python3 -m pytest -q -m gpu tests/kernels/test_gemv.py tests/kernels/test_rmsnorm_qkv_rope.py \
      -k "e5m2 or own_launches" -p no:cacheprovider > "$out/tests.txt" 2>&1
    logged tests $?
    tail -3 "$out/tests.txt" | tee -a "$out/log.txt";;
  walk)
    walk="python3 scripts/experiments/step_launches.py --shape llama-2-7b --weights fp8_e5m2 --steps 100 --pdl"
    timeout 330 $walk --grids quick full > "$out/walk_fp16.txt" 2>&1
    logged "walk fp16" $?
    reverted "$diff" timeout 90 $walk --ab > "$out/ab_fp32.txt" 2>&1
    logged "ab fp32" $?;;
  70b)
    for v in fp16 fp32; do
      $(as $v) timeout 150 $bench --shape llama-2-70b --new-tokens 128 > "$out/bench_70b_$v.txt" 2>&1
      logged $v $?
      rows "$out/bench_70b_$v.txt"
    done;;
esac
