# With tried.diff applied: the pipelined GEMV launches' GPU tests, then stages.py's walk for each weight format,
# each walk at most SECONDS_PER_WALK of walking (its build, tuning and confirmation come on top). h200/ holds the
# run at c447a9d on one H200: `bash scripts/experiments/gemv_stages/run.sh OUT "fp8_e5m2 q4_0" 110`.
#   bash scripts/experiments/gemv_stages/run.sh OUTDIR "fp8_e5m2 q4_0" [SECONDS_PER_WALK] [SHAPE]
. scripts/experiments/record.sh "$@"
weights=$2; budget=${3:-110}; shape=${4:-llama-2-7b}
python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/kernels/test_gemv.py tests/kernels/test_rmsnorm_qkv_rope.py \
  -k pipelined > "$out/tests.txt" 2>&1
logged tests $?
tail -3 "$out/tests.txt"
for w in $weights; do
  python3 scripts/experiments/gemv_stages/stages.py --shape "$shape" --weights "$w" --budget "$budget" \
    > "$out/walk_${shape}_$w.txt" 2>&1
  logged "walk $shape $w" $?
  grep -E "chosen|model's launches  |: [0-9]+ s$" "$out/walk_${shape}_$w.txt"
done
