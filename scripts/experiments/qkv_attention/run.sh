#!/usr/bin/env bash
# The fused kernel's GPU tests, qkv_attention_ab.py at 7B (bf16 and FP8 E5M2), then bench on the default path, one
# GPU:  bash scripts/experiments/qkv_attention/run.sh OUTDIR
. scripts/experiments/record.sh "$@"
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_qkv_attention.py \
  tests/kernels/test_decode_attention.py tests/test_triton_backend.py > "$out/gpu_tests.txt" 2>&1
logged "gpu tests" $?
tail -3 "$out/gpu_tests.txt" | tee -a "$out/log.txt"
timeout $((470 - SECONDS)) python3 scripts/experiments/qkv_attention/qkv_attention_ab.py llama-2-7b --fp8 \
  > "$out/ab_7b.txt" 2>&1
logged "ab 7b" $?
grep "run" "$out/ab_7b.txt" | tee -a "$out/log.txt"
timeout $((580 - SECONDS)) python3 -m llamafast bench --random-weights --shape llama-2-7b --fp8 --backend triton \
  --out "$out/bench_7b.json" > "$out/bench_7b.txt" 2>&1
logged "bench 7b" $?
tail -8 "$out/bench_7b.txt" | tee -a "$out/log.txt"
