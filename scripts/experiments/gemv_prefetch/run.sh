# The per-op GEMVs with each tile loaded a step ahead and summed to rows at once (GemvConfig.prefetch = 1, the
# persistent kernel's _prefetched loop, under PDL too), which holds two FP8 tiles in the registers of one tile's
# fp32 products. On one H200 at b54a8c5 every such launch lost in the whole 7B FP8 step, by 0.7-85%: best 2.2052
# ms/token against 2.1901 for the committed launches (walk_7b_fp8.txt), so the code was taken out again. To
# repeat: `git apply scripts/experiments/gemv_prefetch/tried.diff` on a tree of that time, then from the
# repository root on one GPU: the launches' tests, then the walk (step_launches.py --grids prefetch). The walk's
# header names commit bdf4a14, the git HEAD the device's copy of the tree carried; its files were b54a8c5's.
#   bash scripts/experiments/gemv_prefetch/run.sh OUT_DIR "fp8_e5m2 bf16" [SECONDS_PER_WALK]
set -u
out=$1; weights=$2; limit=${3:-330}
mkdir -p "$out"
. scripts/gpu_env.sh
SECONDS=0
python3 -m pytest -q -p no:cacheprovider tests/kernels/test_gemv.py tests/kernels/test_rmsnorm_qkv_rope.py \
  -k ahead > "$out/tests.txt" 2>&1
echo "tests rc=$? ${SECONDS}s" | tee -a "$out/tests.txt"
for w in $weights; do
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  echo "# python scripts/experiments/step_launches.py --shape llama-2-7b --weights $w --steps 100" \
    "--grids prefetch --pdl, $gpu, $(date -u +%F)" > "$out/walk_$w.txt"
  timeout "$limit" python3 scripts/experiments/step_launches.py --shape llama-2-7b --weights "$w" --steps 100 \
    --grids prefetch --pdl >> "$out/walk_$w.txt" 2>&1
  echo "walk $w rc=$? ${SECONDS}s" | tee -a "$out/walk_$w.txt"
done
