#!/usr/bin/env bash
# The sparse FFN on block weights on one GPU, in one call of at most about 420 s: its kernel, sparsify and bench-twin
# tests (the 7B and SmolLM2 shapes in every block format among them), then bench sparse at 7B with Q4_0 and Q8_0
# copies beside bf16, router and gate mode at half the groups, each beside its dense run:
#   bash scripts/experiments/sparse_blocks/run.sh OUTDIR
. scripts/experiments/record.sh "$@"
timeout 240 python3 -m pytest -q -p no:cacheprovider -rfE tests/kernels/test_sparse_ffn.py \
  tests/kernels/test_decode_step_sparse.py tests/gguf_models/test_blocks.py -k "sparse or sparsify or twins or tied" \
  > "$out/tests.txt" 2>&1
logged "tests" $?
timeout 170 python3 -m llamafast bench sparse --random-weights --shape llama-2-7b --weights q4_0,q8_0 \
  --sparsity 0.5 --sparse-mode router --sparse-mode gate --out "$out/bench_sparse_7b.json" \
  > "$out/bench_sparse_7b.txt" 2>&1
logged "bench sparse 7b" $?
tail -1 "$out/tests.txt" | tee -a "$out/log.txt"
