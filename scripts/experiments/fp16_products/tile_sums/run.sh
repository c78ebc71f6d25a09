#!/usr/bin/env bash
# E5M2 products in packed fp16, summed in fp16 tiles beside the fp32 ones (tile_sums.diff), against fp32
# products (the diff reverted), on one H200, a call a stage, each variant in its own process. Run at 8ed0f8f with
# the diff applied (`git apply scripts/experiments/fp16_products/tile_sums/tile_sums.diff`):
#   bash scripts/experiments/fp16_products/tile_sums/run.sh OUTDIR ab|kernels
# Each stage's log.txt is kept here as log_<stage>.txt. Lost, and taken out: the fp16 tiles take more registers
# (loop_sass.txt), so fewer programs fit an SM.
# ab: 7B FP8 decode, the products paired along K in inline PTX ("asm"), in LLVM's own packing ("native", _ASM
#   off) and fp32, alternated twice: 314.7 / 314.6, 308.7 / 308.7 against 466.6 / 466.5 tok/s (bf16 292.7 beside
#   each); then the GEMV tests on the GPU: 497 passed.
# kernels: `bench kernels --fp8`, each kernel alone, every FP8 GEMV slower: the five 243.4 against 215.3 µs.
. scripts/experiments/record.sh "$@"
diff=scripts/experiments/fp16_products/tile_sums/tile_sums.diff
asm_on='_ASM = tl.constexpr(not INTERPRET)' asm_off='_ASM = tl.constexpr(False)'
as() { [ "$1" = fp32 ] && echo "reverted $diff"; }  # the words that run a command as the variant
case ${2:?stage: ab or kernels} in
  ab)
    for round in 1 2; do
      for v in asm native fp32; do
        [ "$v" = native ] && sed -i "s/^$asm_on/$asm_off/" kernels/gemv_tiles.py
        $(as $v) timeout 60 python3 -m llamafast bench --random-weights --fp8 --backend triton --shape llama-2-7b \
          > "$out/bench_${v}_$round.txt" 2>&1
        logged "$v $round" $?
        [ "$v" = native ] && sed -i "s/^$asm_off/$asm_on/" kernels/gemv_tiles.py
        grep -E "triton +│ (bfloat16|fp8_e5m2)" "$out/bench_${v}_$round.txt" | tee -a "$out/log.txt"
      done
    done
    git diff --stat | tee -a "$out/log.txt"
    timeout 200 python3 -m pytest -q -m gpu tests/kernels/test_gemv.py tests/kernels/test_rmsnorm_qkv_rope.py \
      -p no:cacheprovider > "$out/tests.txt" 2>&1
    logged tests $?
    tail -3 "$out/tests.txt" | tee -a "$out/log.txt";;
  kernels)
    for v in fp16 fp32; do
      $(as $v) timeout 120 python3 -m llamafast bench kernels --fp8 --shape llama-2-7b > "$out/kernels_$v.txt" 2>&1
      logged $v $?
    done
    git diff --stat | tee -a "$out/log.txt";;
esac
