#!/usr/bin/env bash
# attention_wo's GPU tests, then ab.py at 7B (bf16 and FP8) with wo's launch variants and pauses between polls:
#   bash scripts/experiments/attention_wo/run2.sh OUTDIR
. scripts/experiments/record.sh "$@"
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_attention_wo.py > "$out/tests.txt" 2>&1
logged "tests" $?
tail -3 "$out/tests.txt" | tee -a "$out/log.txt"
timeout 300 python3 scripts/experiments/attention_wo/ab.py llama-2-7b --fp8 --variants > "$out/ab_7b.txt" 2>&1
logged "ab 7b" $?
grep -h "run\|equal\|watchdog" "$out"/ab_*.txt | tee -a "$out/log.txt"
