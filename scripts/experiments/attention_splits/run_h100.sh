#!/usr/bin/env bash
# The H100's 7B attention launch (8 splits of the cache's size) against the same launch cutting the current
# length into splits of at least 32 positions (min_split 32, the H200's entry), bf16 and FP8 E5M2, in bench's
# cache (prompt + 264 positions) and in a 4,096-position one (chat's and serve's), after 16 and 1,000 tokens:
#   bash scripts/experiments/attention_splits/run_h100.sh OUTDIR
. scripts/experiments/record.sh "$@"
ab=scripts/experiments/attention_splits/ab.py
timeout 120 python3 $ab llama-2-7b --fp8 --cache 280 --min-splits 32 > "$out/ab_7b_280.txt" 2>&1
logged "ab 7b cache 280" $?
timeout 120 python3 $ab llama-2-7b --fp8 --min-splits 32 > "$out/ab_7b_4096.txt" 2>&1
logged "ab 7b cache 4096" $?
timeout 150 python3 $ab llama-2-7b --fp8 --prompt 1000 --min-splits 32 > "$out/ab_7b_1000.txt" 2>&1
logged "ab 7b 1000 tokens" $?
grep -h "run\|equal" "$out"/ab_*.txt | tee -a "$out/log.txt"
