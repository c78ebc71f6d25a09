# ab.py with the committed float-activation loop and with DIFF's, each in its own process: the committed one is
# the tree with DIFF taken out (record.sh's `reverted`) where DIFF is applied, else the tree as it is and DIFF
# applied for the second; then the float-activation GPU tests with DIFF's loop.
#   bash scripts/experiments/small_floats/run.sh OUTDIR DIFF
#   weights_first.diff: each tile's weights scaled in registers before the wait for x, in (rows, blocks, 16) tiles
#   runs_of_8.diff: the Q4 nibbles loaded 8 bytes at a time, in the layout of x's 8 bf16 (committed)
# h200_weights_first/ and h200_runs_of_8/ hold the runs with each (the latter with a bench row after it).
. scripts/experiments/record.sh "$@"
diff=${2:?usage: run.sh OUTDIR DIFF}
export LLAMAFAST_TUNE=0
name=$(basename "$diff" .diff)
if git apply --check -R "$diff" 2>/dev/null; then  # DIFF is in the tree
  reverted "$diff" python3 scripts/experiments/small_floats/ab.py > "$out/ab_committed.txt" 2>&1
  logged ab_committed $?
else
  python3 scripts/experiments/small_floats/ab.py > "$out/ab_committed.txt" 2>&1
  logged ab_committed $?
  git apply "$diff" || exit 1
fi
python3 scripts/experiments/small_floats/ab.py > "$out/ab_$name.txt" 2>&1
logged "ab_$name" $?
python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/kernels/test_gemv.py tests/kernels/test_rmsnorm_qkv_rope.py \
  -k float_blocks > "$out/tests_$name.txt" 2>&1
logged tests $?
tail -3 "$out/tests_$name.txt"
grep ms/token "$out"/ab_*.txt
