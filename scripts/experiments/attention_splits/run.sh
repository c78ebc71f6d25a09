#!/usr/bin/env bash
# decode attention's GPU tests, then ab.py at 7B (16- and 1,000-token prompts) and 70B FP8, one GPU:
#   bash scripts/experiments/attention_splits/run.sh OUTDIR
# (h200_run1 ran it with min_split set through a module global and the tests run at 0, 32 and 128 that way,
# before AttentionConfig had the field; the kernel's arithmetic was the same.)
. scripts/experiments/record.sh "$@"
python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_decode_attention.py > "$out/tests.txt" 2>&1
logged "tests" $?
tail -1 "$out/tests.txt" | tee -a "$out/log.txt"
ab=scripts/experiments/attention_splits/ab.py
timeout 150 python3 $ab llama-2-7b --fp8 > "$out/ab_7b.txt" 2>&1
logged "ab 7b" $?
timeout 100 python3 $ab llama-2-7b --fp8-only --prompt 1000 > "$out/ab_7b_1000.txt" 2>&1
logged "ab 7b 1000" $?
timeout $((530 - SECONDS)) python3 $ab llama-2-70b --fp8-only > "$out/ab_70b.txt" 2>&1
logged "ab 70b" $?
grep -h "run\|equal" "$out"/ab_*.txt | tee -a "$out/log.txt"
