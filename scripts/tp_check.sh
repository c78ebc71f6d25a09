#!/usr/bin/env bash
# The two-GPU check of tensor parallel, in one run of at most 9.5 minutes on a machine of two GPUs: first what
# checks (the sync kernels' GPU tests; every GPU test under tests/tp: stories260K's greedy tokens, 7B's logits and
# `generate` at TP=2, symm and nccl, against TP=1), then what times: `bench` under torchrun at 7B, 70B (where a GPU
# holds its 69 GB shard) and 13B with TP=2 symm beside nccl and TP=1, scripts/profile_tp.py's cost per
# synchronisation point at each shape with each variant's step by kernel (--timeline), and time to first token at
# 512 and 4,000 tokens, then at 4,000 split by kernel (scripts/profile_tp_prefill.py). A step that would not end
# inside the budget is skipped and says so. Writes each step's raw output into OUTDIR and a summary.md of the
# figures. Naming steps runs only those; sweep_7b, sweep_13b and sweep_70b (profile_tp.py --sweep: the launches of
# symm's consumers, whose winners go into the kernels' "summed" entries by hand) run only when named, as on GPUs
# other than those the committed entries were swept on.
#   bash scripts/tp_check.sh OUTDIR [BUDGET_S [STEP ...]]
# Needs .whl/ beside the checkout as scripts/gpu_check.sh does (the gguf wheel).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: tp_check.sh OUTDIR [BUDGET_S [STEP ...]]}
budget=${2:-570}
only=" ${*:3} "
mkdir -p "$out"
. scripts/gpu_env.sh || exit 1
SECONDS=0  # the budget is the steps': gpu_env.sh's few seconds of set-up are not theirs
export OMP_NUM_THREADS=1
tr="python3 -m torch.distributed.run --standalone --nproc-per-node 2"

# step NAME SECONDS COMMAND...: runs COMMAND with at most SECONDS, if that much of the budget is left. Each limit is
# 1.3 to 2.2 times what the step took on two H100s, Triton cache cold (scripts/results/tp/h100x2_*/log.txt).
step() {
  local name=$1 limit=$2 left=$((budget - SECONDS))
  shift 2
  if [ "$only" != "  " ] && [[ "$only" != *" $name "* ]]; then
    return
  fi
  if [ "$left" -lt "$limit" ]; then
    echo "== $name: skipped, ${left} s of the budget left, it needs ${limit} s" | tee -a "$out/log.txt"
    return
  fi
  echo "== $name ($(date +%T))" | tee -a "$out/log.txt"
  local t0=$SECONDS
  timeout "$limit" "$@" > "$out/$name.txt" 2>&1
  echo "== $name: exit $?, $((SECONDS - t0)) s" | tee -a "$out/log.txt"
}

{ nvidia-smi -L; nvidia-smi topo -m; } > "$out/machine.txt" 2>&1
mem_gb=$(python3 -c "import torch; print(torch.cuda.get_device_properties(0).total_memory // 2**30)")

step tests_sync 60 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/kernels/test_tp_sync.py
step tests_tp 300 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/tp
step bench_7b 60 $tr -m llamafast bench --random-weights --shape llama-2-7b --new-tokens 256 \
  --out "$out/tp2_7b.json"
if [ "$mem_gb" -ge 75 ]; then  # 64 GiB of bf16 weights a rank
  # 84 s on two H200s, which tune the shard's launches first (33 s) and hold TP=1 whole
  # (scripts/results/tp/h200x2_e89b9bd)
  step bench_70b 150 $tr -m llamafast bench --random-weights --shape llama-2-70b --new-tokens 128 \
    --out "$out/tp2_70b.json"
else
  echo "== bench_70b: skipped, ${mem_gb} GiB per GPU holds no 69 GB shard with its cache" | tee -a "$out/log.txt"
fi
step bench_13b 80 $tr -m llamafast bench --random-weights --shape llama-2-13b --new-tokens 256 \
  --out "$out/tp2_13b.json"
for shape in 7b 13b 70b; do
  step "profile_$shape" 90 $tr scripts/profile_tp.py --shape "llama-2-$shape" --timeline \
    --out "$out/profile_$shape.json"
done
for shape in 7b 13b 70b; do
  if [[ "$only" == *" sweep_$shape "* ]]; then  # 33, 40 and 121 s on two H100s (scripts/results/tp/h100x2_sweep)
    step "sweep_$shape" 240 $tr scripts/profile_tp.py --shape "llama-2-$shape" --sweep --out "$out/sweep_$shape.json"
  fi
done
step prefill_7b 100 $tr -m llamafast bench --random-weights --shape llama-2-7b --prefill --prompt-lens 512,4000 \
  --reps 5 --backend triton --out "$out/tp2_prefill_7b.json"
step prefill_profile_7b 150 env LLAMAFAST_TP_TIMEOUT=300 $tr scripts/profile_tp_prefill.py --shape llama-2-7b \
  --tokens 4000 --out "$out/prefill_profile_7b.json"

# The figures, one line each, last in the output.
python3 - "$out" <<'EOF' | tee "$out/summary.md"
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
print(f"# Two-GPU check\n\n{(out / 'machine.txt').read_text().splitlines()[0]}\n")
for line in (out / "log.txt").read_text().splitlines():
    print(f"    {line}")
for name in ("tests_sync", "tests_tp"):
    path = out / f"{name}.txt"
    if path.is_file():
        tail = [s for s in path.read_text().splitlines() if s.strip()]
        print(f"- {name}: {tail[-1] if tail else 'no output'}")
for shape in ("7b", "13b", "70b"):
    path = out / f"sweep_{shape}.json"
    if path.is_file():
        for kernel, w in json.loads(path.read_text())["steps"][-1]["winners"].items():
            print(f"- sweep {shape} {kernel} {w['key']}: {w['config']}, {w['ms_per_token']:.3f} ms/token")
for shape in ("7b", "13b", "70b"):
    path = out / f"profile_{shape}.json"
    if path.is_file():
        for s in json.loads(path.read_text())["steps"]:
            extra = "".join(f", {k} {v:.2f}" for k, v in s.items() if k in ("us_per_point", "drift_us_per_point"))
            print(f"- profile {shape} {s['variant']}: {s['ms_per_token']:.3f} ms/token{extra}")
for shape in ("7b", "13b", "70b"):
    path = out / f"tp2_{shape}.json"
    if path.is_file():
        for r in json.loads(path.read_text())["results"]:
            tp = f"{r.get('tp', 1)} {r.get('tp_comm') or ''}".strip()
            vs = r.get("vs_tp1")
            print(f"- {shape} TP={tp}: {r['decode_tokens_per_s']:.1f} tok/s, {r['decode_ms_per_token']:.3f} ms/token, "
                  f"{100 * r['fraction_of_copy_bw']:.1f}% of copy BW, vs TP=1 {vs and round(vs, 2)}")
path = out / "prefill_profile_7b.json"
if path.is_file():
    for r in json.loads(path.read_text())["rows"]:
        print(f"- prefill profile 7B {r['variant']} chunk {r['chunk']}: ttft {r['ttft_ms']:.2f} ms, "
              f"kernels {r['kernels_ms']:.2f} ms")
path = out / "tp2_prefill_7b.json"
if path.is_file():
    for r in json.loads(path.read_text())["results"]:
        graphs = "prompt graphs" if r.get("prompt_graphs") else "eager"
        print(f"- prefill 7B {r['prompt_tokens']} TP={r.get('tp', 1)} {r.get('tp_comm') or ''} {graphs}: "
              f"ttft {r['ttft_ms']:.2f} ms, vs TP=1 {r.get('vs_tp1') and round(r['vs_tp1'], 2)}")
EOF
