#!/usr/bin/env bash
# tried.diff applied: decode attention's GPU tests with the trigger on, then ab.py at 7B and at 7B FP8 after
# 1,000 tokens, one GPU:  bash scripts/experiments/attention_trigger/run.sh OUTDIR
. scripts/experiments/record.sh "$@"
python3 - > "$out/tests.txt" 2>&1 <<'PY'
import importlib, sys, pytest
importlib.import_module("llamafast.kernels.decode_attention").TRIGGER = True
sys.exit(pytest.main(["-q", "-m", "gpu", "-p", "no:cacheprovider", "tests/test_triton_backend.py", "tests/test_golden.py"]))
PY
logged "tests" $?
tail -1 "$out/tests.txt" | tee -a "$out/log.txt"
ab=scripts/experiments/attention_trigger/ab.py
timeout 150 python3 $ab llama-2-7b --fp8 > "$out/ab_7b.txt" 2>&1
logged "ab 7b" $?
timeout $((300 - SECONDS)) python3 $ab llama-2-7b --fp8-only --prompt 1000 > "$out/ab_7b_1000.txt" 2>&1
logged "ab 7b 1000" $?
grep -h "run" "$out"/ab_*.txt | tee -a "$out/log.txt"
