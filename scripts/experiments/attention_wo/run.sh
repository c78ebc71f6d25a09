#!/usr/bin/env bash
# One GPU: attention_wo's GPU tests and the decode tests that run it, then ab.py at 7B (bf16 and FP8, with wo's
# launch variants), at 7B FP8 after a 1,000-token prompt (attention in several splits), and 70B FP8 if time is left:
#   bash scripts/experiments/attention_wo/run.sh OUTDIR [BUDGET_S]
. scripts/experiments/record.sh "$@"
budget=${2:-560}
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/kernels/test_attention_wo.py \
  tests/test_triton_backend.py tests/test_golden.py > "$out/tests.txt" 2>&1
logged "tests" $?
tail -3 "$out/tests.txt" | tee -a "$out/log.txt"
ab=scripts/experiments/attention_wo/ab.py
timeout $((budget - SECONDS - 150)) python3 $ab llama-2-7b --fp8 --variants > "$out/ab_7b.txt" 2>&1
logged "ab 7b" $?
timeout $((budget - SECONDS - 110)) python3 $ab llama-2-7b --fp8-only --prompt 1000 > "$out/ab_7b_1000.txt" 2>&1
logged "ab 7b 1000" $?
timeout $((budget - SECONDS)) python3 $ab llama-2-70b --fp8-only > "$out/ab_70b.txt" 2>&1
logged "ab 70b" $?
grep -h "run\|equal\|watchdog" "$out"/ab_*.txt | tee -a "$out/log.txt"
