#!/usr/bin/env bash
# Block formats' decode GEMVs on int8 activations (on) against float activations (off: config.INT8_DOT without
# the formats named in OFF), one process each, alternated twice; each variant tunes its launches in a folder of its
# own, so neither reads the other's. Every run times bf16 beside its copies in the same process.
#   bash scripts/experiments/int8_ab.sh OFF WEIGHTS     e.g. int8_ab.sh q5_k,q6_k q5_k,q6_k,q4_k_m
off=${1:?usage: int8_ab.sh OFF_FORMATS WEIGHTS} weights=${2:?usage: int8_ab.sh OFF_FORMATS WEIGHTS}
for rep in 1 2; do
  for variant in on off; do
    echo "== run $rep, int8 activations for $off $variant"
    LLAMAFAST_TUNE_DIR=/tmp/llamafast-tune-$variant python3 -c "
import sys
import llamafast.config as config
if sys.argv[1] == 'off':
    config.INT8_DOT = tuple(f for f in config.INT8_DOT if f not in sys.argv[2].split(','))
from llamafast.cli import app
app(sys.argv[3:])" "$variant" "$off" bench --random-weights --shape llama-2-7b --backend triton --weights "$weights" \
      2>&1 | grep -v "^tun"
  done
done
