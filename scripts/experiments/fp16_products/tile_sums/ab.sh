#!/usr/bin/env bash
# One call on one H200: 7B FP8 E5M2 decode with the GEMVs' fp16 products in inline PTX pairs along K (this
# tree), in LLVM's own packing (_ASM off) and with fp32 products (tile_sums.diff reverted), each bench in its own
# process, the three alternated twice; then the GEMV kernel tests on the GPU with this tree.
# Lost on one H200 at 8ed0f8f: 7B FP8 314.7 / 314.6 tok/s (PTX pairs), 308.7 / 308.7 (LLVM's packing) against
# 466.6 / 466.5 with fp32 products (bf16 292.7 beside each). The fp16 tiles beside the fp32 ones take more registers
# (loop_sass.txt): fewer programs fit an SM. The GPU tests passed on it. To repeat: `git apply
# scripts/experiments/fp16_products/tile_sums/tile_sums.diff` at 8ed0f8f, then
#   bash scripts/experiments/fp16_products/tile_sums/ab.sh OUTDIR
set -u
out=${1:?}
mkdir -p "$out"
. scripts/gpu_env.sh || exit 1
here=scripts/experiments/fp16_products/tile_sums
SECONDS=0
asm_on='_ASM = tl.constexpr(not INTERPRET)' asm_off='_ASM = tl.constexpr(False)'
b="python3 -m llamafast bench --random-weights --fp8 --backend triton --shape llama-2-7b"
for round in 1 2; do
  for variant in asm native fp32; do
    [ "$variant" = fp32 ] && git apply -R "$here/tile_sums.diff"
    [ "$variant" = native ] && sed -i "s/^$asm_on/$asm_off/" kernels/gemv_tiles.py
    timeout 60 $b > "$out/bench_${variant}_$round.txt" 2>&1
    echo "$variant $round: exit $? ${SECONDS}s" | tee -a "$out/log.txt"
    [ "$variant" = fp32 ] && git apply "$here/tile_sums.diff"
    [ "$variant" = native ] && sed -i "s/^$asm_off/$asm_on/" kernels/gemv_tiles.py
    grep -E "triton +│ (bfloat16|fp8_e5m2)" "$out/bench_${variant}_$round.txt" | tee -a "$out/log.txt"
  done
done
git diff --stat | tee -a "$out/log.txt"
timeout 200 python3 -m pytest -q -m gpu tests/kernels/test_gemv.py tests/kernels/test_rmsnorm_qkv_rope.py \
  -p no:cacheprovider > "$out/tests.txt" 2>&1
echo "tests: exit $? ${SECONDS}s" | tee -a "$out/log.txt"
tail -3 "$out/tests.txt" | tee -a "$out/log.txt"
