# The whole-step walks of FP8 launches on the 8-byte tiles, 7B (quick, then the full grid) and 70B (quick), on one H200:
#   bash scripts/experiments/fp8_layout/walks.sh OUTDIR
set -u
out=$1; mkdir -p $out
. scripts/gpu_env.sh || exit 1
echo "# python scripts/experiments/step_launches.py --shape llama-2-7b --weights fp8_e5m2 --steps 100 --grids quick full --pdl" > $out/walk_7b.txt
timeout 330 python3 scripts/experiments/step_launches.py --shape llama-2-7b --weights fp8_e5m2 --steps 100 --grids quick full --pdl >> $out/walk_7b.txt 2>&1
echo "walk 7b: exit $? ${SECONDS}s" | tee -a $out/log.txt
echo "# python scripts/experiments/step_launches.py --shape llama-2-70b --weights fp8_e5m2 --steps 30 --grids quick --pdl" > $out/walk_70b.txt
timeout 230 python3 scripts/experiments/step_launches.py --shape llama-2-70b --weights fp8_e5m2 --steps 30 --grids quick --pdl >> $out/walk_70b.txt 2>&1
echo "walk 70b: exit $? ${SECONDS}s" | tee -a $out/log.txt
