# The whole-step walks of the 7B GEMV launches on one H100 (bf16 over the full grid then the quick list; FP8 E5M2
# under PDL over the quick list then the full grid), each under its own time limit, then the 7B block formats
# beside bf16 if the call has time left (a device call runs at most 600 s).
#   bash scripts/experiments/h100_walk/walks.sh OUTDIR
set -u
out=$1; mkdir -p "$out"
. scripts/gpu_env.sh || exit 1
walk="python3 scripts/experiments/step_launches.py --shape llama-2-7b"
echo "# $walk --weights bf16 --steps 60 --grids full quick" > "$out/walk_7b_bf16.txt"
timeout 250 $walk --weights bf16 --steps 60 --grids full quick >> "$out/walk_7b_bf16.txt" 2>&1
echo "walk bf16: exit $? ${SECONDS}s" | tee -a "$out/log.txt"
echo "# $walk --weights fp8_e5m2 --pdl --steps 80 --grids quick full" > "$out/walk_7b_fp8.txt"
timeout $((480 - SECONDS)) $walk --weights fp8_e5m2 --pdl --steps 80 --grids quick full >> "$out/walk_7b_fp8.txt" 2>&1
echo "walk fp8: exit $? ${SECONDS}s" | tee -a "$out/log.txt"
if [ $SECONDS -lt 400 ]; then
  b="llamafast bench decode --random-weights --shape llama-2-7b --backend triton --weights q8_0,q4_0,q4_k"
  echo "# $b" > "$out/bench_7b_blocks.txt"
  timeout $((570 - SECONDS)) $b --out "$out/bench_7b_blocks.json" >> "$out/bench_7b_blocks.txt" 2>&1
  echo "blocks: exit $? ${SECONDS}s" | tee -a "$out/log.txt"
fi
