#!/usr/bin/env bash
# Regenerates docs/tensor-parallel.md's figures on two GPUs (run of record: 2 x H200, NVLink): TP=2 with both
# --tp-comm modes side by side in one process, then TP=1 on GPU 0 in the same call; 7B, 13B and 70B shapes in bf16
# (70B: TP=2 only, 138 GB does not fit one GPU); time to first token at 512 and 4,000 tokens; and the prompt
# collectives measurement that decided the prefill path (scripts/tp_prefill_collectives.py).
#   bash scripts/bench_tp.sh [OUTDIR] [STAGES]     (default scripts/results/tp; 7b,13b,70b,prefill,collectives)
set -euo pipefail
out=${1:-scripts/results/tp}
stages=${2:-7b,13b,70b,prefill,collectives}
mkdir -p "$out"
tp2="python -m torch.distributed.run --standalone --nproc-per-node 2"
decode() {  # shape, new tokens, tp1 (yes/no)
  $tp2 -m llamafast bench --random-weights --shape "llama-2-$1" --new-tokens "$2" --out "$out/tp2_$1.json"
  if [ "$3" = yes ]; then
    CUDA_VISIBLE_DEVICES=0 python -m llamafast bench --random-weights --shape "llama-2-$1" --backend triton --new-tokens "$2" \
      --out "$out/tp1_$1.json"
  fi
}
[[ $stages == *7b* ]] && decode 7b 256 yes
[[ $stages == *13b* ]] && decode 13b 256 yes
[[ $stages == *70b* ]] && decode 70b 128 no
if [[ $stages == *prefill* ]]; then
  $tp2 -m llamafast bench --random-weights --shape llama-2-7b --prefill --prompt-lens 512,4000 --reps 7 \
    --backend triton --out "$out/tp2_prefill_7b.json"
  CUDA_VISIBLE_DEVICES=0 python -m llamafast bench --random-weights --shape llama-2-7b --prefill --prompt-lens 512,4000 \
    --reps 7 --backend triton --out "$out/tp1_prefill_7b.json"
fi
[[ $stages == *collectives* ]] && $tp2 scripts/tp_prefill_collectives.py "$out/prefill_collectives.json"
true
