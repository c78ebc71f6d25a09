#!/usr/bin/env bash
# Regenerates docs/benchmarks.md's start-up figures on one GPU (run of record: an H100): shell to first token
# (scripts/time_to_first_token.py: a new process each run, median of 3 after a warm-up run, so the page cache,
# Triton's cache and the kernel lists are warm) for a bare `import torch, triton` (what any torch program pays on
# that machine), --help, the bundled model, and a Llama-2-7B Hugging Face checkpoint of random bf16 weights written
# to local disk, with and without kernel preloading (LLAMAFAST_PRELOAD=0), then its FP8 conversion; each run's
# --json phases (one JSON line each, in OUTDIR/startup.jsonl); two `llamafast chat` sessions whose second turn
# (about 50 tokens) follows a conversation of about 1,000 tokens (OUTDIR/chat_7b.txt, /stats lines); and
# OUTDIR/summary.txt: each run's shell to first token less the bare import of the same call, llamafast's own part.
#   bash scripts/bench_startup.sh OUTDIR TOKENIZER.model [CHECKPOINT_DIR]
set -euo pipefail
out=$1; tok=$2; ck=${3:-/tmp/llamafast-7b}
mkdir -p "$out"
log="$out/startup.jsonl"
ttft="python scripts/time_to_first_token.py --reps 3 --out $log"
prompt="The capital of France is"
$ttft -- python3 -c "import torch, triton; print(0)"
$ttft -- llamafast --help
$ttft -- llamafast generate "Once upon a time" --max-new-tokens 32
llamafast generate "Once upon a time" --max-new-tokens 32 --json >> "$log"
[ -d "$ck/hf" ] || PYTHONPATH=. python scripts/make_random_checkpoint.py --shape llama-2-7b --tokenizer "$tok" "$ck/hf"
$ttft -- llamafast generate --model "$ck/hf" "$prompt" --max-new-tokens 32
LLAMAFAST_PRELOAD=0 $ttft -- llamafast generate --model "$ck/hf" "$prompt" --max-new-tokens 32  # without preloading
llamafast generate --model "$ck/hf" "$prompt" --max-new-tokens 32 --json >> "$log"
[ -d "$ck/fp8" ] || llamafast convert-fp8 "$ck/hf" "$ck/fp8" > /dev/null
$ttft -- llamafast generate --model "$ck/fp8" "$prompt" --max-new-tokens 32
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
