# Tuning on first use with the candidates compiled ahead, on one GPU, each run from an empty Triton cache and
# tuning folder: `bench --random-weights --shape llama-2-7b --weights FORMAT` for each block format given, then
# scripts/tune.py first-use at 7B bf16 (every table tuned from scratch, then decode on the committed and on the
# tuned launches, alternately).
#   bash scripts/experiments/compile_ahead/first_use.sh OUTDIR FORMAT...   e.g. q8_0 q4_0
. scripts/experiments/record.sh "$@"
shift
for fmt in "$@"; do
  TRITON_CACHE_DIR=$out/triton_$fmt tuned_bench "$fmt" 150 --random-weights --shape llama-2-7b --weights "$fmt"
  rm -rf "$out/triton_$fmt"
done
TRITON_CACHE_DIR=$out/triton_bf16 timeout 240 python3 scripts/tune.py first-use --shape llama-2-7b \
  --out "$out/first_use_bf16.json" > "$out/first_use_bf16.txt" 2>&1
logged first_use_bf16 $?
rm -rf "$out/triton_bf16"
nproc > "$out/nproc.txt"
grep -H -E "^│ triton|tuned" "$out"/bench_*.txt "$out"/first_use_bf16.txt
