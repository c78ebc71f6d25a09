#!/usr/bin/env bash
# Decode, prefill and tuning at 7B, 13B and 70B on one GPU (an H100; the 70b stage an H200): each stage checks, then times.
#   bash scripts/bench_shapes.sh [OUTDIR] [STAGES]   (default scripts/results/shapes; all but 70b)
# Stages, each writing OUTDIR/<name>.json and .txt:
#   tests     the GPU tests of prompt graphs, the timeline, tuning, the fused attention merge and the staged load
#   timeline  bench --timeline: 7B bf16 and FP8 E5M2, 13B bf16 (the per-layer timeline the targets are explained by)
#   decode    7B bf16 + FP8 E5M2 (triton); 13B triton beside compile, and bf16 + FP8 (targets: 7B FP8 400, bf16 212;
#             13B bf16 100, FP8 200 tok/s)
#   prefill   time to first token at 512 and 4,000 tokens, prompts from CUDA graphs beside eager (targets 12 / 95 ms)
#   tune      launch tables tuned on first use, from an empty Triton cache (scripts/tune_first_use.py; target 60 s)
#   tables    the full launch sweep at 13B, bf16 and FP8 E5M2 weights (scripts/tune_kernels.py), for committed tables
#   70b       Llama-2-70B FP8 E5M2 on one GPU (an H200; target 55 tok/s), and its FP8 launch sweep
set -euo pipefail
out=${1:-scripts/results/shapes}
stages=${2:-tests,timeline,decode,prefill,tune}
mkdir -p "$out"
b="python -m llamafast bench --random-weights"
run() {  # name, command...: the command's stdout into name.txt (its --out JSON beside it)
  local name=$1
  shift
  "$@" | tee "$out/$name.txt"
}
if [[ $stages == *tests* ]]; then
  run gpu_tests python -m pytest -q -m gpu -p no:cacheprovider tests/engine tests/kernels/test_decode_attention.py \
    tests/test_weights.py tests/test_triton_backend.py tests/tp/test_shard.py || true
fi
if [[ $stages == *timeline* ]]; then
  run timeline_7b $b --shape llama-2-7b --timeline --fp8 --reps 20 --out "$out/timeline_7b.json"
  run timeline_13b $b --shape llama-2-13b --timeline --reps 20 --out "$out/timeline_13b.json"
fi
if [[ $stages == *decode* ]]; then
  run bench_7b_fp8 $b --shape llama-2-7b --fp8 --out "$out/bench_7b_fp8.json"
  run bench_13b $b --shape llama-2-13b --backend triton --backend compile --out "$out/bench_13b.json"
  run bench_13b_fp8 $b --shape llama-2-13b --fp8 --out "$out/bench_13b_fp8.json"
fi
if [[ $stages == *prefill* ]]; then
  run prefill_7b $b --shape llama-2-7b --prefill --prompt-lens 128,512,2048,4000 --backend triton \
    --out "$out/prefill_7b.json"
fi
if [[ $stages == *tune* ]]; then
  TRITON_CACHE_DIR=$(mktemp -d) run tune env PYTHONPATH=. python scripts/tune_first_use.py --shape llama-2-7b \
    --out "$out/tune.json"
fi
if [[ $stages == *tables* ]]; then
  run tune_13b env PYTHONPATH=. python scripts/tune_kernels.py --shape llama-2-13b --out "$out/tune_13b.json"
  run tune_13b_fp8 env PYTHONPATH=. python scripts/tune_kernels.py --shape llama-2-13b --fp8 e5m2 \
    --out "$out/tune_13b_fp8.json"
fi
if [[ $stages == *70b* ]]; then
  run bench_70b_fp8 $b --shape llama-2-70b --fp8 --new-tokens 128 --out "$out/bench_70b_fp8.json"
  run tune_70b_fp8 env PYTHONPATH=. python scripts/tune_kernels.py --shape llama-2-70b --fp8 e5m2 \
    --out "$out/tune_70b_fp8.json"
fi
true
