# The whole-step walks of FP8 launches on the 8-byte tiles, on one H200: 7B (the quick list, then the full grid)
# and 70B (the quick list), each under PDL and its own time limit.
#   bash scripts/experiments/fp8_layout/walks.sh OUTDIR   (its outputs here, at 8b5b28f: walk_7b.txt, walk_70b.txt)
set -u
out=$1; mkdir -p $out
. scripts/gpu_env.sh || exit 1
walk="python3 scripts/experiments/step_launches.py --weights fp8_e5m2 --pdl"
echo "# $walk --shape llama-2-7b --steps 100 --grids quick full" > $out/walk_7b.txt
timeout 330 $walk --shape llama-2-7b --steps 100 --grids quick full >> $out/walk_7b.txt 2>&1
echo "walk 7b: exit $? ${SECONDS}s" | tee -a $out/log.txt
echo "# $walk --shape llama-2-70b --steps 30 --grids quick" > $out/walk_70b.txt
timeout 230 $walk --shape llama-2-70b --steps 30 --grids quick >> $out/walk_70b.txt 2>&1
echo "walk 70b: exit $? ${SECONDS}s" | tee -a $out/log.txt
