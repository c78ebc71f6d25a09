#!/usr/bin/env bash
# The GPU check every change to code the GPU runs passes, in one run of at most 9 minutes on
# one H100: the whole `gpu` test suite (the default-path tests of tests/cli/test_default_path.py among
# them), then Llama-2-7B random-weight benches: bf16 and FP8 E5M2 decode beside each other, and time to first
# token at 16, 512 and 4,000 prompt tokens. Writes OUTDIR/summary.md (the commit, GPU, versions, test counts,
# the bench figures) and each step's raw output beside it.
#   GPU_CHECK_COMMIT=<sha> bash scripts/gpu_check.sh OUTDIR
# with the sha of the tree it runs, taken where it was committed: a copy of a working tree sent to a GPU machine
# can carry older git metadata than its files (one reported the session's first commit).
# Needs beside the checkout, as ignored folders (the device copy carries them): .whl/ with the gguf wheel the
# device image lacks (python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl gguf,
# and for the server fastapi opentelemetry-api starlette uvicorn pydantic pydantic_core annotated-types
# annotated-doc typing-inspection typing_extensions, with --platform manylinux2014_x86_64),
# and .testdata/ with ../shared/testdata's stories260K and llama2c. SmolLM2's 94 MB do not fit one call's 64 MiB, so
# its tests skip here; they run in two calls to the same machine: `split -n 2 -d FILE` into .gguf_parts/a/part and
# .gguf_parts/b/part (ignored), carry the first and copy it to /tmp, then carry the second and `cat` both into
# .testdata/smollm2/ (check its sha256) before `pytest -m gpu tests -k "smollm2 or SmolLM2 or gguf"`.
# scripts/gpu_env.sh runs the project from this tree. The device returns at most 8 files from a call: a call that runs
# more beside the check tars OUTDIR into one file.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: gpu_check.sh OUTDIR}
mkdir -p "$out"
commit=${GPU_CHECK_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
. scripts/gpu_env.sh || exit 1

t0=$SECONDS
workers=$(python3 -c "import xdist" 2>/dev/null && echo "-n 4 --dist loadfile")
# --durations: which tests spend the check's minutes (their compiles among them), for the next call's plan.
# shellcheck disable=SC2086
python3 -m pytest -q -m gpu -p no:cacheprovider $workers -rfE --durations=25 tests > "$out/tests.txt" 2>&1
tests_rc=$?
tests_s=$((SECONDS - t0))

b="python3 -m llamafast bench --random-weights --shape llama-2-7b"
$b --fp8 --out "$out/decode_7b.json" > "$out/decode_7b.txt" 2>&1
decode_rc=$?
$b --prefill --prompt-lens 16,512,4000 --backend triton --out "$out/prefill_7b.json" > "$out/prefill_7b.txt" 2>&1
prefill_rc=$?

python3 - "$out" "$commit" "$tests_rc" "$tests_s" "$decode_rc" "$prefill_rc" <<'EOF'
import json, platform, sys
from pathlib import Path

import torch, triton

out, commit, tests_rc, tests_s, decode_rc, prefill_rc = sys.argv[1:]
out = Path(out)
tail = [line for line in (out / "tests.txt").read_text().splitlines() if line.strip()]
gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA GPU"
lines = [f"# GPU check of {commit}", "",
         f"{gpu}; torch {torch.__version__}, triton {triton.__version__}, "
         f"Python {platform.python_version()}", "",
         f"## gpu tests (exit {tests_rc}, {tests_s} s): {tail[-1] if tail else 'no output'}", ""]
lines += [f"    {line}" for line in tail if line.startswith(("FAILED", "ERROR"))]
for name, rc in (("decode_7b", decode_rc), ("prefill_7b", prefill_rc)):
    lines += ["", f"## {name} (exit {rc})", ""]
    path = out / f"{name}.json"
    if not path.is_file():
        lines += ["    " + line for line in (out / f"{name}.txt").read_text().splitlines()[-5:]]
        continue
    report = json.loads(path.read_text())
    if "copy_bw_gb_s" in report:
        lines.append(f"copy bandwidth {report['copy_bw_gb_s']:.0f} GB/s; prompt {report['prompt_tokens']}, "
                     f"new {report['new_tokens']}")
    for r in report["results"]:
        if "decode_tokens_per_s" in r:
            lines.append(f"- {r['backend']} {r['weights']}: {r['decode_tokens_per_s']:.1f} tok/s, "
                         f"{100 * r['fraction_of_copy_bw']:.1f}% of copy BW, ttft {r['ttft_ms']:.2f} ms")
        else:
            graphs = "prompt graphs" if r["prompt_graphs"] else "eager"
            lines.append(f"- {r['backend']} ({graphs}) {r['prompt_tokens']} tokens: ttft {r['ttft_ms']:.2f} ms")
(out / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
[ "$tests_rc" -eq 0 ] && [ "$decode_rc" -eq 0 ] && [ "$prefill_rc" -eq 0 ]
