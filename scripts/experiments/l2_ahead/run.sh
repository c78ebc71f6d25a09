#!/usr/bin/env bash
# wo's weights asked of L2 while attention runs (l2_ahead.diff: kernels/l2_ahead.py; each attention program first
# prefetches the leading bytes of its share of wo's rows, within a budget of the L2), on one H200: the GPU tests
# of the attention kernel and of the prefetch, then l2_ahead_ab.py at Llama-2-7B (bf16, FP8 E5M2) and Llama-2-70B
# (FP8 E5M2), each shape in its own process, the budgets alternated three times in it. Run at 2654800 with the
# diff applied (`git apply scripts/experiments/l2_ahead/l2_ahead.diff`):
#   bash scripts/experiments/l2_ahead/run.sh OUTDIR
# Lost in both forms, and taken out (H200, L2 60 MiB):
# bulk/ (cp.async.bulk.prefetch.L2, 4 requests a row; the script's VARIANTS were then budgets 0, 0.25, 0.5 and 1
#   of the L2, all bulk): 7B FP8 449.1-450.0 tok/s against 466.0-466.3 off; bf16 283.8-287.1 against
#   292.6-292.8, the more bytes asked for the slower; 70B FP8 49.9-50.9 against 54.8-55.0. Its GPU tests passed
#   (101, gpu_tests.txt).
# lines/ (one prefetch.global.L2 per 128-byte line; the ab loop alone, as l2_ahead_ab.py is now): 7B FP8
#   447.3-447.9 against 463.3-463.5 off, bulk 446.8-447.1 beside them; bf16 280.6-281.3 against 288.8-289.0;
#   70B FP8 51.6-52.2 against 51.1-52.8 off (noisy that call), bulk 50.7-50.9.
# In each form the 7B step is 2.2-2.9 µs a layer slower: whatever wo gains from finding its rows in L2 (not timed
# alone), asking for them costs more. DRAM left idle during attention is not what the step lacks.
. scripts/experiments/record.sh "$@"
timeout 150 python3 -m pytest -q -m gpu tests/kernels/test_l2_ahead.py tests/kernels/test_decode_attention.py \
  > "$out/gpu_tests.txt" 2>&1
logged "gpu tests" $?
tail -3 "$out/gpu_tests.txt" | tee -a "$out/log.txt"
for shape in llama-2-7b llama-2-70b; do
  timeout $((560 - SECONDS)) python3 scripts/experiments/l2_ahead/l2_ahead_ab.py $shape > "$out/ab_$shape.txt" 2>&1
  logged "ab $shape" $?
  tail -30 "$out/ab_$shape.txt" | tee -a "$out/log.txt"
done
