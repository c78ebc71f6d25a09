#!/usr/bin/env bash
# Q4_K decode GEMVs on int8 activations (on) against float activations (off: config.INT8_DOT without q4_k), one
# process each, alternated twice; each variant tunes its launches in a folder of its own, so neither reads the
# other's. Every run times bf16 beside its copies in the same process.
#   bash scripts/experiments/q4_k_int8_ab.sh
for rep in 1 2; do
  for variant in on off; do
    echo "== run $rep, int8 activations for Q4_K $variant"
    LLAMAFAST_TUNE_DIR=/tmp/llamafast-tune-$variant python3 -c "
import sys
import llamafast.config as config
if sys.argv[1] == 'off':
    config.INT8_DOT = tuple(f for f in config.INT8_DOT if f != 'q4_k')
from llamafast.cli import app
app(sys.argv[2:])" "$variant" bench --random-weights --shape llama-2-7b --backend triton --weights q4_k,q4_k_m 2>&1 \
      | grep -v "^tun"
  done
done
