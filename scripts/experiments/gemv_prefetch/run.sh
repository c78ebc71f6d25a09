# On one GPU, from the repository root: the prefetching GEMV launches' tests, then the whole-step walk of their
# launches (step_launches.py --grids prefetch) for the weights given, each stage under its own time limit.
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
  echo "# python scripts/experiments/step_launches.py --shape llama-2-7b --weights $w --steps 100 --grids prefetch --pdl, $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), commit $(git rev-parse --short HEAD 2>/dev/null || echo worktree), $(date -u +%F)" > "$out/walk_$w.txt"
  timeout "$limit" python3 scripts/experiments/step_launches.py --shape llama-2-7b --weights "$w" --steps 100 \
    --grids prefetch --pdl >> "$out/walk_$w.txt" 2>&1
  echo "walk $w rc=$? ${SECONDS}s" | tee -a "$out/walk_$w.txt"
done
