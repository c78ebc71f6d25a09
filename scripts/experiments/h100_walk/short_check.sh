# The part of the GPU check that a change to the H100's own launches and to tuning on first use reaches, for a call
# too short for scripts/gpu_check.sh: the gpu tests of every committed and per-GPU launch against the reference
# (tests/kernels/test_gemv.py), tuning's and the triton backend's; 7B bf16 and FP8 E5M2 decode beside each other;
# then, in what is left of LIMIT seconds (default 330), this GPU's tables against the committed ones alone, in turn
# in one process (step_launches.py --ab).
#   GPU_CHECK_COMMIT=<sha> [LIMIT=S] bash scripts/experiments/h100_walk/short_check.sh OUTDIR
set -u
out=$1; mkdir -p "$out"
limit=${LIMIT:-330}
. scripts/gpu_env.sh || exit 1
{ echo "commit ${GPU_CHECK_COMMIT:-unknown}"; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; } > "$out/log.txt"
timeout $((limit - 150)) python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 --dist loadfile -rfE \
  tests/kernels/test_gemv.py tests/engine/test_tuning.py tests/engine/test_tuning_ways.py tests/test_triton_backend.py > "$out/tests.txt" 2>&1
echo "gpu tests: exit $? ${SECONDS}s: $(tail -1 "$out/tests.txt")" | tee -a "$out/log.txt"
b="python3 -m llamafast bench --random-weights --shape llama-2-7b --fp8 --backend triton"
echo "# $b" > "$out/decode_7b.txt"
timeout $((limit - 30 - SECONDS)) $b --out "$out/decode_7b.json" >> "$out/decode_7b.txt" 2>&1
echo "decode: exit $? ${SECONDS}s" | tee -a "$out/log.txt"
if [ $SECONDS -lt $((limit - 40)) ]; then
  a="python3 scripts/experiments/step_launches.py --shape llama-2-7b --weights fp8_e5m2 bf16 --ab --steps 80"
  echo "# $a" > "$out/ab_7b.txt"
  timeout $((limit - SECONDS)) $a >> "$out/ab_7b.txt" 2>&1
  echo "ab: exit $? ${SECONDS}s" | tee -a "$out/log.txt"
fi
