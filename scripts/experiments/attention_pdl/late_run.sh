#!/usr/bin/env bash
# late_ab.py with late.diff applied, then op_cost.py at 70B FP8, one GPU:
#   bash scripts/experiments/attention_pdl/late_run.sh OUTDIR
. scripts/experiments/record.sh "$@"
git apply scripts/experiments/attention_pdl/late.diff || exit 1
timeout 240 python3 scripts/experiments/attention_pdl/late_ab.py > "$out/late_ab.txt" 2>&1
logged "late_ab" $?
git apply -R scripts/experiments/attention_pdl/late.diff
grep "run" "$out/late_ab.txt" | tee -a "$out/log.txt"
timeout $((560 - SECONDS)) python3 scripts/experiments/op_cost/op_cost.py llama-2-70b --fp8-only > "$out/op_cost_70b.txt" 2>&1
logged "op_cost 70b" $?
grep -v Warn "$out/op_cost_70b.txt" | tee -a "$out/log.txt"
