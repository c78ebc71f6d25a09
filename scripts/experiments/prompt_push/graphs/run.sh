#!/usr/bin/env bash
# One call on two H200s: tensor-parallel prompts replayed from CUDA graphs. First what checks (every GPU test
# under tests/tp, the prompt replayed from its graph among them), then `bench prefill` at 512 and 4,000 tokens
# (TP=2 symm and nccl, each with prompt graphs and eager, beside TP=1), then 70B decode, then the copy-engine row
# blocks of ../blocks/ inside the graphs (blocks.diff: its GPU test, then `bench prefill` with symm).
#   bash scripts/experiments/prompt_push/graphs/run.sh OUTDIR
set -u
out=${1:?}
mkdir -p "$out"
. scripts/gpu_env.sh || exit 1
export OMP_NUM_THREADS=1
tr="python3 -m torch.distributed.run --standalone --nproc-per-node 2"
here=scripts/experiments/prompt_push/graphs
run() {  # run NAME SECONDS COMMAND...
  local name=$1 limit=$2 t0=$SECONDS
  shift 2
  timeout "$limit" "$@" > "$out/$name.txt" 2>&1
  echo "$name: exit $?, $((SECONDS - t0)) s" | tee -a "$out/log.txt"
}
run tests_tp 240 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/tp
run prefill_7b 150 $tr -m llamafast bench --random-weights --shape llama-2-7b --prefill --prompt-lens 512,4000 \
  --reps 5 --backend triton --out "$out/tp2_prefill_7b.json"
run bench_70b 170 $tr -m llamafast bench --random-weights --shape llama-2-70b --new-tokens 128 \
  --out "$out/tp2_70b.json"
git apply "$here/blocks.diff" && echo "blocks.diff applied" >> "$out/log.txt"
run blocks_test 60 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/tp/test_tp_run.py \
  -k "stories_tp2_greedy_on_gpus and symm"
run blocks_prefill_7b 120 $tr -m llamafast bench --random-weights --shape llama-2-7b --prefill \
  --prompt-lens 512,4000 --reps 5 --backend triton --tp-comm symm --out "$out/blocks_prefill_7b.json"
git apply -R "$here/blocks.diff" && echo "blocks.diff reverted" >> "$out/log.txt"
