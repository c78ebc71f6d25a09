#!/usr/bin/env bash
# Llama-2-7B decode on one H200 as bench times it, greedy and with the default sampling (temperature 0.6, top-p
# 0.9), the triton backend, bf16 and its FP8 E5M2 copy, one process each:
#   bash scripts/results/h200/sampling/run.sh OUTDIR
. scripts/experiments/record.sh "$@"
for way in greedy sampled; do
  opts=""; [ $way = sampled ] && opts="--temperature 0.6"
  timeout $((230 - SECONDS)) python3 -m llamafast bench --random-weights --shape llama-2-7b --fp8 --backend triton \
    $opts > "$out/bench_7b_$way.txt" 2>&1
  logged "$way" $?
  tail -6 "$out/bench_7b_$way.txt" | tee -a "$out/log.txt"
done
