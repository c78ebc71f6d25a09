#!/usr/bin/env bash
# One call on one GPU: a random Llama-2-7B checkpoint (bf16, Hugging Face layout) quantized to a Q4_0 GGUF file
# by `llamafast quantize`, then gguf_memory.py on it: the GPU memory its weights take against the file's tensors.
#   bash scripts/experiments/gguf_memory/run.sh OUTDIR
. scripts/experiments/record.sh "$@"
tmp=/tmp/gguf_memory
rm -rf $tmp && mkdir -p $tmp
timeout 200 python3 scripts/make_random_checkpoint.py --shape llama-2-7b --tokenizer .testdata/llama2c/tokenizer.model \
  $tmp/7b > "$out/make.txt" 2>&1
logged make $?
timeout 240 python3 -m llamafast quantize $tmp/7b $tmp/7b_q4_0.gguf --format q4_0 > "$out/quantize.txt" 2>&1
logged quantize $?
rm -rf $tmp/7b
timeout $((560 - SECONDS)) python3 scripts/experiments/gguf_memory/gguf_memory.py $tmp/7b_q4_0.gguf \
  > "$out/gguf_memory_7b_q4_0.txt" 2>&1
logged memory $?
cat "$out/gguf_memory_7b_q4_0.txt" | tee -a "$out/log.txt"
# Ran at 5245102 (with the next commit's GGUF loader in the tree, which Q4_0 files do not reach) on one H200:
# gguf_memory_7b_q4_0.txt, quantize.txt, log.txt.
