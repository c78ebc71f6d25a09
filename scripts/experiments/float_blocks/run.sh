# The float-activation block GEMVs' GPU tests, then ab.py at SmolLM2-135M's shape (Q4_1 layers and a Q8_0 LM head,
# the test data's file's formats), then the bench row beside bf16.
#   bash scripts/experiments/float_blocks/run.sh OUTDIR [SHAPE] [WEIGHTS]
. scripts/experiments/record.sh "$@"
shape=${2:-smollm2-135m}; weights=${3:-q4_1}
python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/kernels/test_gemv.py tests/kernels/test_rmsnorm_qkv_rope.py \
  -k float_blocks > "$out/tests.txt" 2>&1
logged tests $?
tail -3 "$out/tests.txt"
python3 scripts/experiments/float_blocks/ab.py --shape "$shape" --weights $weights > "$out/ab_$shape.txt" 2>&1
logged ab $?
grep -E "tuned: |int8 activations|ms/token|tuned in" "$out/ab_$shape.txt"
llamafast bench --random-weights --shape "$shape" --backend triton --weights "${weights// /,}" \
  --out "$out/bench_$shape.json" > "$out/bench_$shape.txt" 2>&1
logged bench $?
tail -8 "$out/bench_$shape.txt"
