#!/usr/bin/env bash
# The H200's 7B launch (8 splits, block 32, 2 warps, min_split 32) beside launches of more or wider splits, in a
# 4,096-position cache, 7B bf16 and FP8 after 16 tokens, FP8 after 1,000:
#   bash scripts/experiments/attention_splits/run3.sh OUTDIR
. scripts/experiments/record.sh "$@"
ab=scripts/experiments/attention_splits/ab.py
launches="16,32,2,32;16,16,2,16;32,16,2,16;8,64,4,64;16,32,4,32"
timeout 170 python3 $ab llama-2-7b --fp8 --min-splits 32 --launches "$launches" > "$out/ab3_7b.txt" 2>&1
logged "ab 7b" $?
timeout $((330 - SECONDS)) python3 $ab llama-2-7b --fp8-only --prompt 1000 --min-splits 32 --launches "$launches" \
  > "$out/ab3_7b_1000.txt" 2>&1
logged "ab 7b 1000" $?
grep -h "run\|equal" "$out"/ab3_*.txt | tee -a "$out/log.txt"
