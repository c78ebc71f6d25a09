#!/usr/bin/env bash
# With min_split in AttentionConfig: ab.py at 7B FP8 after 16 and 1,000 prompt tokens (the H200's 7B entry, 32,
# against 0 in the same process), 13B bf16 (40 KV heads, no H200 entry) after 1,000, 70B FP8 at 128 and 512:
#   bash scripts/experiments/attention_splits/run2.sh OUTDIR
. scripts/experiments/record.sh "$@"
ab=scripts/experiments/attention_splits/ab.py
timeout 100 python3 $ab llama-2-7b --fp8-only --min-splits 32 > "$out/ab2_7b.txt" 2>&1
logged "ab 7b" $?
timeout 100 python3 $ab llama-2-7b --fp8-only --prompt 1000 --min-splits 32 > "$out/ab2_7b_1000.txt" 2>&1
logged "ab 7b 1000" $?
timeout 150 python3 $ab llama-2-13b --prompt 1000 --min-splits 32,128 > "$out/ab2_13b_1000.txt" 2>&1
logged "ab 13b 1000" $?
grep -h "run\|equal" "$out"/ab2_*.txt | tee -a "$out/log.txt"
timeout $((560 - SECONDS)) python3 $ab llama-2-70b --fp8-only --min-splits 128,512 > "$out/ab2_70b.txt" 2>&1
logged "ab 70b" $?
grep -h "run\|equal" "$out"/ab2_70b.txt | tee -a "$out/log.txt"
