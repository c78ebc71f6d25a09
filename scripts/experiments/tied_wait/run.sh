# The float loop's first tile tied to the PDL wait (kernels/pdl.py) against the plain wait, on one H200:
# SmolLM2-135M's shape (small_floats/ab.py: bf16, Q4_1 layers with a Q8_0 head, fixed launches, each way three
# times in one process) with the plain wait ("committed": blocks.diff reverted), with the float loop tied, and with
# the dense bf16/FP8 loop's first tile tied too (dense.diff applied); then Llama-2-7B bf16 and FP8 E5M2 (`bench
# --fp8`, the committed H200 launches) with the dense loop plain and tied, each in its own process; then the first
# two again. h200/ holds the run, made before the tied float loop landed (the GEMV tests at its end ran past their
# 150 s and are left out).
#   bash scripts/experiments/tied_wait/run.sh OUTDIR
. scripts/experiments/record.sh "$@"
d=scripts/experiments/tied_wait
export LLAMAFAST_TUNE=0
ab() { timeout 90 python3 scripts/experiments/small_floats/ab.py > "$out/ab_$1.txt" 2>&1; logged "ab_$1" $?; }
b7() {
  timeout 150 python3 -m llamafast bench --random-weights --shape llama-2-7b --fp8 --backend triton \
    > "$out/bench_7b_$1.txt" 2>&1
  logged "bench_7b_$1" $?
}
reverted $d/blocks.diff ab committed
ab blocks
applied $d/dense.diff ab tied
b7 committed
applied $d/dense.diff b7 tied
reverted $d/blocks.diff ab committed_2
applied $d/dense.diff ab tied_2
grep -H ms/token "$out"/ab_*.txt
grep -H -E "^│ triton" "$out"/bench_7b_*.txt
