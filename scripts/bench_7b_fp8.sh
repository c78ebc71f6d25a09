#!/usr/bin/env bash
# Regenerates docs/fp8.md's speed figures on one GPU (run of record: an H100):
#   bash scripts/bench_7b_fp8.sh [OUTDIR]
# Writes into OUTDIR (default scripts/results):
#   bench_7b_fp8_e5m2.*, bench_7b_fp8_e4m3.*  triton on bf16 weights and on FP8 weights quantized from them, one run each
#   kernels_7b_fp8_e5m2.*                     each decode kernel on E5M2 weights against its reference
#   convert_7b.json                           convert-fp8 of a 7B Hugging Face checkpoint (random bf16) from disk
set -euo pipefail
out=${1:-scripts/results}
mkdir -p "$out"
for fmt in e5m2 e4m3; do
  python -m llamafast bench --config configs/bench-7b.toml --fp8 --fp8-format $fmt --out "$out/bench_7b_fp8_$fmt.json" \
    | tee "$out/bench_7b_fp8_$fmt.txt"
done
python -m llamafast bench --kernels --shape llama-2-7b --fp8 --context 4096 --out "$out/kernels_7b_fp8_e5m2.json" \
  | tee "$out/kernels_7b_fp8_e5m2.txt"
src=${SCRATCH:-/tmp}/llama-2-7b-random-hf
PYTHONPATH=. python scripts/make_random_checkpoint.py --shape llama-2-7b \
  --tokenizer llamafast/data/stories260K/tok512.model "$src"
sync && (echo 3 > /proc/sys/vm/drop_caches) 2>/dev/null || echo "page cache not dropped: the source may be read from memory"
python -m llamafast convert-fp8 "$src" "${src%-hf}-fp8" --force --json > "$out/convert_7b.json"
python -c "import json,sys; d=json.load(open(sys.argv[1])); print({k: d[k] for k in ('seconds','bytes_written','peak_anon_rss_gb','saturated')})" "$out/convert_7b.json"
rm -rf "$src" "${src%-hf}-fp8"
