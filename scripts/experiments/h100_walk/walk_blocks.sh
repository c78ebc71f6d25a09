# The whole-step walks of the 7B block GEMVs on one GPU, each from the launches tuning on first use gives it, each
# candidate in each of its ways: Q8_0 over the quick list then the full grid (the 370 tok/s aim is closest), then
# Q4_0 over the quick list in what is left of the call (a device call runs at most 600 s).
#   bash scripts/experiments/h100_walk/walk_blocks.sh OUTDIR
set -u
out=$1; mkdir -p "$out"
. scripts/gpu_env.sh || exit 1
walk="python3 scripts/experiments/step_launches.py --shape llama-2-7b --steps 60"
echo "# $walk --weights q8_0 --grids quick full" > "$out/walk_7b_q8_0.txt"
timeout 380 $walk --weights q8_0 --grids quick full >> "$out/walk_7b_q8_0.txt" 2>&1
echo "walk q8_0: exit $? ${SECONDS}s" | tee -a "$out/log.txt"
if [ $SECONDS -lt 470 ]; then
  echo "# $walk --weights q4_0 --grids quick" > "$out/walk_7b_q4_0.txt"
  timeout $((580 - SECONDS)) $walk --weights q4_0 --grids quick >> "$out/walk_7b_q4_0.txt" 2>&1
  echo "walk q4_0: exit $? ${SECONDS}s" | tee -a "$out/log.txt"
fi
