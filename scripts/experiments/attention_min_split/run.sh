#!/usr/bin/env bash
# Attention alone at each length in a 4,096-position cache (alone.py), then the graphed 13B bf16 step with the
# split cut that tuning on first use picks against splits of the cache's size (../attention_splits/ab.py):
#   bash scripts/experiments/attention_min_split/run.sh OUTDIR
. scripts/experiments/record.sh "$@"
export LLAMAFAST_TUNE_DIR=$out/tune
timeout 200 python3 scripts/experiments/attention_min_split/alone.py llama-2-7b llama-2-13b llama-2-70b \
  smollm2-135m > "$out/alone.txt" 2>&1
logged alone $?
ab=scripts/experiments/attention_splits/ab.py
timeout $((480 - SECONDS)) python3 $ab llama-2-13b --prompt 1000 --min-splits 32,64,128 > "$out/ab_13b_1000.txt" 2>&1
logged "ab 13b 1000" $?
grep -h "run\|equal\|launch" "$out"/ab_*.txt | tee -a "$out/log.txt"
