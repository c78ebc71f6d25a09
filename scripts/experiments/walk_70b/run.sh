#!/usr/bin/env bash
# One call on one H200: 70B's FP8 E5M2 GEMV launches walked under PDL over tuning's full grid (the quick list was
# walked in scripts/experiments/fp8_layout/walk_70b.txt), from the H200 tables.
#   bash scripts/experiments/walk_70b/run.sh OUTDIR
# At 1504cb8: nothing kept (walk_70b_full.txt): its choices timed again 18.46-19.00 ms/token against the committed
# 18.63-18.93: at 30 steps a launch, the same tables timed 1.6% apart in three turns.
. scripts/experiments/record.sh "$@"
walk="python3 scripts/experiments/step_launches.py --shape llama-2-70b --weights fp8_e5m2 --steps 30 --pdl"
echo "# $walk --grids full" > "$out/walk_70b_full.txt"
timeout 420 $walk --grids full >> "$out/walk_70b_full.txt" 2>&1
logged "walk 70b full" $?
