#!/usr/bin/env bash
# step_gaps.py at SmolLM2-135M's shape (bf16) and Llama-2-7B's (bf16 and FP8 E5M2), each in its own process, on
# one GPU:  bash scripts/experiments/step_gaps/run.sh OUTDIR
# At 187acd4 on one H200 (the .txt files): graphs of 1, 2, 4 or 8 steps take the same time a step (SmolLM2 406.6-407.4
# µs, 7B bf16 3,408.0-3,409.0, FP8 2,135.5-2,137.8), so a replay boundary costs nothing measurable; handing each
# token to the host as stream_tokens does (bench decode) adds 7-10 µs a step.
. scripts/experiments/record.sh "$@"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > "$out/gpu.txt"
for args in "smollm2-135m" "llama-2-7b --fp8"; do
  name=${args%% *}
  timeout $((540 - SECONDS)) python3 scripts/experiments/step_gaps/step_gaps.py $args > "$out/$name.txt" 2>&1
  logged "$args" $?
  tail -6 "$out/$name.txt" | tee -a "$out/log.txt"
done
