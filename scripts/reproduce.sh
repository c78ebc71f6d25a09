#!/usr/bin/env bash
# The commands behind the results tables in docs/: one stage per table, each writing its raw output where the docs
# cite it (or into OUTDIR). Without a stage, lists them with the machine each needs.
#   bash scripts/reproduce.sh [STAGE [OUTDIR]]
# On a GPU image without the project installed, `. scripts/gpu_env.sh` first (scripts/gpu_check.sh does that itself).
# SmolLM2's GGUF comes from the test data, $LLAMAFAST_TESTDATA (default ../shared/testdata). A few stages read more
# from the environment: fp8 SCRATCH (where the 13.5 GB checkpoint is written), startup and serve TOKENIZER and
# CHECKPOINT_DIR, gpu-check GPU_CHECK_COMMIT.
set -euo pipefail
cd "$(dirname "$0")/.."
data=${LLAMAFAST_TESTDATA:-../shared/testdata}
smollm2_gguf=$data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

# name | machine | the docs table it reproduces | default OUTDIR
STAGES=(
  "decode|1 H100|benchmarks.md: Decode, Llama-2-7B on an H100 (README's bf16 row), cold start-up|scripts/results"
  "prefill|1 H100|benchmarks.md: Prefill, Llama-2-7B on an H100, and the prefill kernels|scripts/results"
  "launch-tables|1 H100|tuning.md: the decode kernels' launch tables (tune_7b*)|scripts/results"
  "fp8|1 H100|fp8.md: Speed (README's FP8 rows), per kernel with E5M2, convert-fp8 of a 7B checkpoint|scripts/results"
  "quality|CPU|fp8.md: Quality, SmolLM2 (FP8 and block formats) and stories260K|scripts/results/quality"
  "quant|1 H100|quantized.md: Speed, Llama-2-7B bf16 beside its Q8_0, Q4_0 and Q4_1 copies|scripts/results/quant"
  "sparse|1 H100|sparse-ffn.md: Speed, per FFN call, its kernel split and launch sweep|scripts/results/sparse"
  "sparse-quality|CPU|sparse-ffn.md: Quality, SmolLM2 and stories260K|scripts/results/sparse/quality"
  "tp|2 H100|tensor-parallel.md: Results, TP=2 (nccl, symm) against TP=1 at 7B, 13B and 70B, per-point costs, prompt TTFT|scripts/results/tp/h100x2_1e915b5"
  "tp-floors|1 H200|tensor-parallel.md: the TP=2 floors, and tuning.md's shard launch tables|scripts/results/tp"
  "h200|1 H200|benchmarks.md: H200 (README's H200 rows), fp8.md's 7B and 70B on the H200|scripts/results/h200"
  "smollm2|1 H100|benchmarks.md: SmolLM2-135M on an H100, its kernels and greedy tokens|scripts/results/smollm2"
  "gguf-load|CPU|benchmarks.md: opening and loading SmolLM2's GGUF on the CPU|scripts/results/smollm2"
  "startup|1 H100|benchmarks.md: Start-up; tuning.md: kernel preloading's chat turn|scripts/results/startup"
  "serve|1 H100|benchmarks.md: The server, llamafast serve against generate at 7B|scripts/results/serve"
  "gpu-check|1 H100|benchmarks.md: GPU check and the prompt-graph figures (scripts/gpu_check.sh)|scripts/results/gpu_check"
)

# The cold run first, from an empty Triton cache: its start-up is the cold-start cost; the others find the cache warm.
stage_decode() {
  export TRITON_CACHE_DIR
  TRITON_CACHE_DIR=$(mktemp -d)
  llamafast bench --config configs/bench-7b.toml --backend triton --out "$1/bench_7b_cold.json" | tee "$1/bench_7b_cold.txt"
  llamafast bench --config configs/bench-7b.toml --out "$1/bench_7b.json" | tee "$1/bench_7b.txt"
  llamafast bench --config configs/bench-7b-long-context.toml --out "$1/bench_7b_long.json" | tee "$1/bench_7b_long.txt"
  llamafast bench --kernels --shape llama-2-7b --context 4096 --out "$1/kernels_7b.json" | tee "$1/kernels_7b.txt"
}

stage_prefill() {
  python scripts/tune.py prefill --out "$1/tune_prefill.json" | tee "$1/tune_prefill.txt"
  llamafast bench --random-weights --shape llama-2-7b --prefill --out "$1/bench_prefill_7b.json" \
    | tee "$1/bench_prefill_7b.txt"
  llamafast bench --kernels --prefill --shape llama-2-7b --out "$1/prefill_kernels_7b.json" \
    | tee "$1/prefill_kernels_7b.txt"
}

stage_launch_tables() {  # attention's launch does not depend on the weights' format: the FP8 sweep leaves it out
  python scripts/tune.py decode --shape llama-2-7b --out "$1/tune_7b.json" | tee "$1/tune_7b.txt"
  python scripts/tune.py decode --shape llama-2-7b --fp8 e5m2 \
    --kernels 'rmsnorm_qkv_rope,linear_residual[wo],rmsnorm_swiglu,linear_residual[w2],rmsnorm_lm_head' \
    --out "$1/tune_7b_fp8_e5m2.json" | tee "$1/tune_7b_fp8_e5m2.txt"
}

stage_fp8() {  # each FP8 model quantized from the bf16 weights it is timed beside; then convert-fp8 from disk
  for fmt in e5m2 e4m3; do
    llamafast bench --config configs/bench-7b.toml --fp8 --fp8-format $fmt --out "$1/bench_7b_fp8_$fmt.json" \
      | tee "$1/bench_7b_fp8_$fmt.txt"
  done
  llamafast bench --kernels --shape llama-2-7b --fp8 --context 4096 --out "$1/kernels_7b_fp8_e5m2.json" \
    | tee "$1/kernels_7b_fp8_e5m2.txt"
  local src=${SCRATCH:-/tmp}/llama-2-7b-random-hf
  PYTHONPATH=. python scripts/make_random_checkpoint.py --shape llama-2-7b \
    --tokenizer llamafast/data/stories260K/tok512.model "$src"
  sync && (echo 3 > /proc/sys/vm/drop_caches) 2>/dev/null || echo "page cache not dropped: the source may be read from memory"
  llamafast convert-fp8 "$src" "${src%-hf}-fp8" --force --json > "$1/convert_7b.json"
  python -c "import json,sys; d=json.load(open(sys.argv[1])); print({k: d[k] for k in ('seconds','bytes_written','peak_anon_rss_gb','saturated')})" \
    "$1/convert_7b.json"
  rm -rf "$src" "${src%-hf}-fp8"
}

stage_quant() {  # each block copy quantized on the device from the bf16 weights it is timed beside
  llamafast bench decode --random-weights --shape llama-2-7b --backend triton --weights q8_0,q4_0,q4_1 \
    --out "$1/bench_7b_blocks.json" | tee "$1/bench_7b_blocks.txt"
  llamafast bench decode --random-weights --shape llama-2-7b --backend triton --weights q4_k,q4_k_m \
    --out "$1/bench_7b_q4_k_m.json" | tee "$1/bench_7b_q4_k_m.txt"
  llamafast bench decode --random-weights --shape smollm2-135m --backend triton --weights q8_0,q4_0,q4_1 \
    --out "$1/bench_smollm2_blocks.json" | tee "$1/bench_smollm2_blocks.txt"
}

stage_quality() {  # reference path on the CPU, fp32 base; stories260K's FFN rows (172) are not whole blocks
  local variants=(--variant fp8_e5m2 --variant fp8_e4m3 --variant bfloat16)
  llamafast eval --device cpu --model "$smollm2_gguf" "${variants[@]}" --variant q8_0 --variant q4_0 --variant q4_1 \
    --out "$1/smollm2.json" | tee "$1/smollm2.txt"
  llamafast eval --device cpu "${variants[@]}" --out "$1/stories260K.json" | tee "$1/stories260K.txt"
}

stage_sparse() {  # dense and sparse decode in one process, bf16 then FP8 E5M2 quantized from the same weights
  llamafast bench --random-weights --shape llama-2-7b --sparsity 0,0.3,0.5,0.7 --sparse-mode router --sparse-mode gate \
    --fp8 --new-tokens 256 --out "$1/bench_sparse_7b.json"
  llamafast bench --kernels --shape llama-2-7b --json --out "$1/kernels_7b_bf16.json" > /dev/null
  llamafast bench --kernels --shape llama-2-7b --fp8 --json --out "$1/kernels_7b_fp8.json" > /dev/null
  python scripts/tune.py sparse --shape llama-2-7b --variants router-bf16,router-fp8 --out "$1/tune_7b.json"
  python scripts/profile_decode.py sparse --shape llama-2-7b --out "$1/profile_7b.json"
}

# Calibration text: what each model samples itself from prompts of many registers (seeds 100+; no corpus needed,
# nothing downloaded). Held out: eval's own sampled stream (other prompts, seeds 0-7). Reference path, fp32.
stage_sparse_quality() {
  local cal=$1/smollm2_calibration.txt i
  local prompts=("Write a short story about a lighthouse keeper." "Explain how a computer stores numbers."
    "def fibonacci(n):" "Dear Sir or Madam, I am writing to" "In 1905, Albert Einstein published"
    "Here is a list of tips for travelling:" "The main ingredients of a good soup are" "Q: What causes the seasons? A:"
    "Breaking news: the city council" "import numpy as np" "Chapter 1. The morning was cold"
    "The history of the printing press")
  : > "$cal"
  for i in "${!prompts[@]}"; do
    llamafast generate "${prompts[$i]}" --model "$smollm2_gguf" --device cpu --temperature 1 --top-p 1 \
      --seed $((100 + i)) --max-new-tokens 300 --echo 2>/dev/null >> "$cal"
    printf '\n\n' >> "$cal"
  done
  llamafast sparsify "$smollm2_gguf" "$1/smollm2-sparse" --text "$cal" --device cpu --force
  llamafast eval --device cpu --model "$1/smollm2-sparse" --sparsity 0.3,0.5,0.7 --variant fp8_e5m2 \
    --out "$1/smollm2.json" | tee "$1/smollm2.txt"
  llamafast sparsify llamafast/data/stories260K/stories260K.bin "$1/stories260K-sparse" --group-size 4 \
    --text tests/data/stories260K_calibration.txt --device cpu --force
  llamafast eval --device cpu --model "$1/stories260K-sparse" --sparsity 0.3,0.5,0.7 --variant fp8_e5m2 \
    --out "$1/stories260K.json" | tee "$1/stories260K.txt"
  rm -rf "$1/smollm2-sparse" "$1/stories260K-sparse"  # 0.27 GB of weights that the stage rebuilds
}

stage_tp() {  # the two-GPU check: symm's tests, then bench at 7B, 70B and 13B, profile_tp.py, TTFT at 4,000 tokens
  bash scripts/tp_check.sh "$1"
}

# Rank 0's shard of a TP=2 split on one GPU (70B's needs an H200). tune.py tp times the floor on the tables as they
# stand, then sweeps: before its winners went into the tables, that floor was the "untuned" column.
stage_tp_floors() {
  local shape
  for shape in 7b 13b 70b; do
    python scripts/tune.py tp --shape "llama-2-$shape" --world 2 --out "$1/tune_tp2_$shape.json"
    python scripts/profile_tp.py --world 2 --shape "llama-2-$shape" --out "$1/floor_tp2_$shape.json"
  done
}

stage_h200() {  # 70B's float weights and their FP8 copy do not fit together: bench times the FP8 weights alone
  llamafast bench --random-weights --shape llama-2-7b --fp8 --out "$1/bench_7b_fp8_h200.json" 2>&1 \
    | tee "$1/bench_7b_fp8_h200.txt"
  llamafast bench --random-weights --shape llama-2-7b --prefill --prompt-lens 16 --backend triton 2>&1 \
    | tee "$1/prefill_16_h200.txt"
  llamafast bench --random-weights --shape llama-2-70b --fp8 --new-tokens 128 --out "$1/bench_70b_fp8.json" 2>&1 \
    | tee "$1/bench_70b_fp8.txt"
  mkdir -p "$1/sampling"  # README's 7B rows, greedy, then generate's default sampling
  for way in greedy sampled; do
    llamafast bench --random-weights --shape llama-2-7b --fp8 --backend triton \
      $([ $way = sampled ] && echo --temperature 0.6) 2>&1 | tee "$1/sampling/bench_7b_$way.txt"
  done
}

stage_smollm2() {  # the real GGUF (test data); greedy tokens against transformers' fp32 golden, in fp32 and bf16
  llamafast bench --model "$smollm2_gguf" --backend triton --backend compile --out "$1/bench_smollm2_gguf.json" \
    | tee "$1/bench_smollm2_gguf.txt"
  llamafast bench --kernels --shape smollm2-135m --context 512 --out "$1/kernels_smollm2.json" \
    | tee "$1/kernels_smollm2.txt"
  python - "$smollm2_gguf" <<'EOF' | tee "$1/smollm2_gpu_greedy.txt"
import json, sys, time
from pathlib import Path

import torch

from llamafast.config import Backend, DType, SamplingConfig
from llamafast.generate import Engine, stream_tokens
from llamafast.load import load_model

golden = json.loads(Path("tests/data/golden_smollm2.json").read_text())
for dtype in (DType.float32, DType.bfloat16):
    t0 = time.perf_counter()
    lm = load_model(Path(sys.argv[1]), device=torch.device("cuda"), dtype=dtype, backend=Backend.triton)
    print(f"{dtype.value}: loaded in {time.perf_counter() - t0:.2f} s")
    for case in golden["greedy"]:
        ids, want = case["prompt_ids"], case["continuation_ids"]
        engine = Engine(lm.model, SamplingConfig(temperature=0), len(ids) + len(want), n_vocab=lm.tokenizer.vocab_size)
        got = list(stream_tokens(engine, ids, len(want)))
        same = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), len(want))
        print(f"  {case['prompt']!r}: {same} of {len(want)} greedy tokens equal transformers' fp32 before the first difference")
EOF
}

stage_gguf_load() {  # five runs: the first after a change also compiles .pyc files
  local i
  for i in 1 2 3 4 5; do
    python - "$smollm2_gguf" <<'EOF'
import time
t0 = time.perf_counter()
import sys
from pathlib import Path

import torch

from llamafast.load import load_model, open_model
t1 = time.perf_counter()
om = open_model(Path(sys.argv[1]))
t2 = time.perf_counter()
lm = load_model(om, device=torch.device("cpu"))
t3 = time.perf_counter()
print(f"imports {t1-t0:.2f} s; open (header, tokenizer) {t2-t1:.2f} s; load (dequantize, build) {t3-t2:.2f} s; "
      f"open + load {t3-t1:.2f} s")
EOF
  done | tee "$1/gguf_load_cpu.txt"
}

# Shell to first token (scripts/time_to_first_token.py: a new process per run, median of 3 after a warm-up run) for a
# bare `import torch, triton`, --help, the bundled model, and a 7B Hugging Face checkpoint of random bf16 weights on
# local disk with and without kernel preloading, then its FP8 conversion; each run's --json phases (startup.jsonl);
# two chat sessions whose second turn (about 50 tokens) follows about 1,000 tokens (chat_7b.txt, /stats lines); and
# summary.txt: each run less the bare import, llamafast's own part. TOKENIZER (default the bundled tok512.model) goes
# beside the checkpoint, which is written once into CHECKPOINT_DIR (default /tmp/llamafast-7b).
stage_startup() {
  local out=$1 tok=${TOKENIZER:-llamafast/data/stories260K/tok512.model} ck=${CHECKPOINT_DIR:-/tmp/llamafast-7b}
  local log=$1/startup.jsonl prompt="The capital of France is" long short run
  local ttft=(python scripts/time_to_first_token.py --reps 3 --out "$log" --)
  "${ttft[@]}" python3 -c "import torch, triton; print(0)"
  "${ttft[@]}" llamafast --help
  "${ttft[@]}" llamafast generate "Once upon a time" --max-new-tokens 32
  llamafast generate "Once upon a time" --max-new-tokens 32 --json >> "$log"
  [ -d "$ck/hf" ] || PYTHONPATH=. python scripts/make_random_checkpoint.py --shape llama-2-7b --tokenizer "$tok" "$ck/hf"
  "${ttft[@]}" llamafast generate --model "$ck/hf" "$prompt" --max-new-tokens 32
  LLAMAFAST_PRELOAD=0 "${ttft[@]}" llamafast generate --model "$ck/hf" "$prompt" --max-new-tokens 32
  llamafast generate --model "$ck/hf" "$prompt" --max-new-tokens 32 --json >> "$log"
  [ -d "$ck/fp8" ] || llamafast convert-fp8 "$ck/hf" "$ck/fp8" > /dev/null
  "${ttft[@]}" llamafast generate --model "$ck/fp8" "$prompt" --max-new-tokens 32
  llamafast generate --model "$ck/fp8" "$prompt" --max-new-tokens 32 --json >> "$log"
  long=$(python -c "import random; r = random.Random(0); print(' '.join(r.choice(['river', 'stone', 'light', 'garden', 'music', 'winter', 'paper', 'north']) for _ in range(900)))")
  short=$(python -c "print(' '.join(['Tell me more about the garden by the river'] * 5))")
  for run in 1 2; do
    printf '%s\n%s\n/stats\n' "$long" "$short" | llamafast chat --model "$ck/hf" --temperature 0 --max-new-tokens 16 \
      | grep '^turns' >> "$out/chat_7b.txt"
  done
  python3 - "$log" > "$out/summary.txt" <<'EOF'
import json, sys

runs = [json.loads(line) for line in open(sys.argv[1]) if '"median_first_byte_s"' in line]
bare = next(r["median_first_byte_s"] for r in runs if r["command"].startswith("python3 -c"))
print(f"bare import torch, triton: {bare:.2f} s (median of 3)")
for r in runs:
    env = " ".join(f"{k}={v}" for k, v in r["env"].items())
    print(f"{r['median_first_byte_s']:.2f} s, llamafast's own {r['median_first_byte_s'] - bare:+.2f} s: "
          f"{env + ' ' if env else ''}{r['command']}")
EOF
  cat "$out/summary.txt"
}

stage_serve() {  # Llama 2's tokenizer (TOKENIZER) for a 7B vocabulary; the checkpoint in CHECKPOINT_DIR
  local tok=${TOKENIZER:-$data/llama2c/tokenizer.model} ck=${CHECKPOINT_DIR:-/tmp/llamafast-7b}
  [ -d "$ck/hf" ] || PYTHONPATH=. python scripts/make_random_checkpoint.py --shape llama-2-7b --tokenizer "$tok" "$ck/hf"
  python scripts/serve_load.py --model "$ck/hf" --out "$1/h100.json" | tee "$1/h100.txt"
}

stage_gpu_check() {
  GPU_CHECK_COMMIT=${GPU_CHECK_COMMIT:-$(git rev-parse HEAD)} bash scripts/gpu_check.sh "$1"
}

list_stages() {
  echo "usage: bash scripts/reproduce.sh STAGE [OUTDIR]"
  echo
  printf '%-15s %-7s %s\n' stage machine "reproduces (docs/), default OUTDIR"
  local entry name machine what out
  for entry in "${STAGES[@]}"; do
    IFS='|' read -r name machine what out <<< "$entry"
    printf '%-15s %-7s %s\n%24s-> %s\n' "$name" "$machine" "$what" "" "$out"
  done
}

if [ $# -eq 0 ]; then
  list_stages
  exit 0
fi
for entry in "${STAGES[@]}"; do
  IFS='|' read -r name machine what default_out <<< "$entry"
  if [ "$name" = "$1" ]; then
    out=${2:-$default_out}
    mkdir -p "$out"
    echo "== $name ($machine): $what; raw output in $out" >&2
    "stage_${name//-/_}" "$out"
    exit 0
  fi
done
echo "reproduce.sh: no stage named '$1'" >&2
list_stages >&2
exit 1
