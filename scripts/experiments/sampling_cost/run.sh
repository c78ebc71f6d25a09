#!/usr/bin/env bash
# The fused sampler's GPU tests, then sampling_cost.py at SmolLM2-135M's shape (bf16) and Llama-2-7B's (bf16, FP8
# E5M2), each in its own process, on one GPU:  bash scripts/experiments/sampling_cost/run.sh OUTDIR
# before/: the first version of sampling_cost.py (the torch sampler alone) at 187acd4; fused_first/: this one at
# 197a7e5, whose kernel reduced every chunk; fused/: at 8e13ef3, each lane keeping its own through the chunks.
. scripts/experiments/record.sh "$@"
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_sample_token.py tests/test_sampling.py \
  tests/serve/test_gpu.py tests/test_triton_backend.py > "$out/gpu_tests.txt" 2>&1
logged "gpu tests" $?
tail -3 "$out/gpu_tests.txt" | tee -a "$out/log.txt"
for args in "smollm2-135m" "llama-2-7b --fp8"; do
  name=${args%% *}
  timeout $((560 - SECONDS)) python3 scripts/experiments/sampling_cost/sampling_cost.py $args > "$out/$name.txt" 2>&1
  logged "$args" $?
  tail -26 "$out/$name.txt" | tee -a "$out/log.txt"
done
