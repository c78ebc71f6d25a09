#!/usr/bin/env bash
# Tried as a user: every `llamafast` command in README.md's bash blocks, exactly as written, from the clone's
# root, with HOME set to a temporary folder whose ~/llama-2-7b (Meta format) and ~/Llama-2-7b-chat-hf (Hugging
# Face) are copies of the test data's stories260K, and ~/calibration.txt is text it sampled. Fails on any traceback, and on any failure except, on a
# machine without a CUDA GPU, a one-line `error:` from a command that needs a GPU or a 7B model's memory.
set -uo pipefail
cd "$(dirname "$0")/.."
data="${LLAMAFAST_TESTDATA:-$(pwd)/../shared/testdata}/stories260K"
[ -d "$data" ] || { echo "smoke: test data not found at $data" >&2; exit 1; }
home=$(mktemp -d)
trap 'rm -rf "$home"' EXIT
cp -r "$data/meta" "$home/llama-2-7b" && cp "$data/tok512.model" "$home/llama-2-7b/tokenizer.model"
cp -r "$data/hf" "$home/Llama-2-7b-chat-hf"
cp tests/data/stories260K_calibration.txt "$home/calibration.txt"  # sparsify's text: the model's own samples
gpu=$(python -c "import torch; print(int(torch.cuda.is_available()))")

commands=$(awk '/^```bash/{on=1; next} /^```/{on=0} on && /(^|\| )llamafast /' README.md)
[ -n "$commands" ] || { echo "smoke: no llamafast commands found in README.md" >&2; exit 1; }
failed=0
while IFS= read -r cmd; do
    out=$(HOME="$home" bash -c "$cmd" 2>"$home/stderr" </dev/null)
    rc=$?
    errors=$(grep -c '^error:' "$home/stderr")
    if grep -q Traceback "$home/stderr"; then
        verdict="FAIL (traceback)"
    elif [ "$rc" -eq 0 ]; then
        verdict=ok
    elif [ "$gpu" = 0 ] && [ "$rc" -eq 1 ] && [ "$errors" -eq 1 ] && [[ "$cmd" =~ --shape\ llama-2-7b|--kernels|bench-7b ]]; then
        verdict="ok (needs a GPU: $(grep '^error:' "$home/stderr" | cut -c1-100))"
    else
        verdict="FAIL (exit $rc)"
    fi
    printf '%-90s %s\n' "$cmd" "$verdict"
    if [[ "$verdict" == FAIL* ]]; then
        failed=1
        sed 's/^/    /' "$home/stderr" | tail -20
    fi
done <<< "$commands"
exit $failed
