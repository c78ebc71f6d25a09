#!/usr/bin/env bash
# candidate.diff applied: decode attention's tests on the GPU (the read-ahead cases among them) and the triton
# backend's, then ab.py at 7B (bf16 and FP8 E5M2), 7B FP8 after 1,000 tokens and SmolLM2's shape; the diff taken
# out after. One GPU, at most about 460 s:  bash scripts/experiments/attention_ahead/run.sh OUTDIR
. scripts/experiments/record.sh "$@"
diff=scripts/experiments/attention_ahead/candidate.diff
ab=scripts/experiments/attention_ahead/ab.py
run_all() {
  timeout 120 python3 -m pytest -q -p no:cacheprovider -rfE tests/kernels/test_decode_attention.py \
    tests/test_triton_backend.py > "$out/tests.txt" 2>&1
  logged "tests" $?
  timeout 150 python3 $ab llama-2-7b --fp8 > "$out/ab_7b.txt" 2>&1
  logged "ab 7b" $?
  timeout 90 python3 $ab llama-2-7b --fp8-only --prompt 1000 > "$out/ab_7b_1000.txt" 2>&1
  logged "ab 7b 1000" $?
  timeout 90 python3 $ab smollm2-135m > "$out/ab_smollm2.txt" 2>&1
  logged "ab smollm2" $?
}
applied "$diff" run_all
tail -1 "$out/tests.txt" | tee -a "$out/log.txt"
grep -h "run" "$out"/ab_*.txt | tee -a "$out/log.txt"
