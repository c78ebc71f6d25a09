#!/usr/bin/env bash
# One call on one H200: the GEMVs loading x in their weight tile's shape where the tile's warps split its rows
# (gemv.x_tile; kernels.diff applied) against the (BLOCK_K,) slice that Triton moves through shared memory there
# (kernels.diff reverted), each in its own process: `bench --fp8` (7B bf16 and FP8) and the TP=2 floor
# (profile_tp.py --world 2: TP=1 and rank 0's 7B shard with no communication); then the GPU check of the tree
# with the diff.
# Lost on one H200 at cca39bf, and taken out: 7B bf16 260.5 against 288.9 tok/s, FP8 436.7 against 463.8, the
# floor 2.177 against 1.912 ms/token (TP=1 3.795 against 3.421). The barriers went, but each thread then loads,
# widens and multiplies x and RMSNorm's weight once per row it holds, which doubled the loop's instructions
# (qkv's FP8 launch, 32 rows and 8 warps: 256 against 129 in sm_90a SASS). The GPU tests passed on it
# (gpu_check_summary.md). To repeat: `git apply scripts/experiments/x_tile/kernels.diff` at 2c1c737, commit, then
#   GPU_CHECK_COMMIT=<sha> bash scripts/experiments/x_tile/run.sh OUTDIR
. scripts/experiments/record.sh "$@"
diff=scripts/experiments/x_tile/kernels.diff
for variant in tile slice; do
  as=""
  [ "$variant" = slice ] && as="reverted $diff"
  $as timeout 60 python3 -m llamafast bench --random-weights --shape llama-2-7b --fp8 --backend triton \
    > "$out/bench_$variant.txt" 2>&1
  logged "bench $variant" $?
  grep -E "triton +│ (bfloat16|fp8_e5m2)" "$out/bench_$variant.txt" | tee -a "$out/log.txt"
  $as timeout 90 python3 scripts/profile_tp.py --world 2 --shape llama-2-7b --out "$out/floor_$variant.json" \
    > "$out/floor_$variant.txt" 2>&1
  logged "floor $variant" $?
  tail -4 "$out/floor_$variant.txt" | tee -a "$out/log.txt"
done
timeout $((585 - SECONDS)) bash scripts/gpu_check.sh "$out/gc"
logged gpu_check $?
