#!/usr/bin/env bash
# op_cost.py at Llama-2-7B's shape (bf16 and FP8 E5M2) on one GPU:  bash scripts/experiments/op_cost/run.sh OUTDIR
. scripts/experiments/record.sh "$@"
shape=${2:-llama-2-7b}
timeout ${3:-200} python3 scripts/experiments/op_cost/op_cost.py "$shape" --fp8 > "$out/$shape.txt" 2>&1
logged "$shape --fp8" $?
tail -14 "$out/$shape.txt" | tee -a "$out/log.txt"
