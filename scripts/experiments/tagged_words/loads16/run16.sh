#!/usr/bin/env bash
# One call on two H200s: the committed flags (tried.diff taken back) timed by scripts/profile_tp.py, then the
# tagged words with 16-byte loads and plain 8-byte stores checked, timed and benched (tp_check.sh).
#   bash scripts/experiments/tagged_words/loads16/run16.sh OUTDIR
set -u
out=${1:?usage: loads16/run16.sh OUTDIR}
diff=scripts/experiments/tagged_words/loads16/tried.diff
mkdir -p "$out/flags" "$out/words"
. scripts/gpu_env.sh || exit 1
export OMP_NUM_THREADS=1
tr="python3 -m torch.distributed.run --standalone --nproc-per-node 2"
profile() {  # DIR SHAPE
  local t0=$SECONDS
  timeout 150 $tr scripts/profile_tp.py --shape "llama-2-$2" --out "$out/$1/profile_$2.json" > "$out/$1/profile_$2.txt" 2>&1
  echo "$1 profile_$2: exit $?, $((SECONDS - t0)) s" | tee -a "$out/log.txt"
}
git apply -R "$diff" > "$out/patch.txt" 2>&1 || { echo "patch -R failed" | tee -a "$out/log.txt"; exit 1; }
profile flags 7b
profile flags 13b
git apply "$diff" >> "$out/patch.txt" 2>&1 || { echo "patch failed" | tee -a "$out/log.txt"; exit 1; }
t0=$SECONDS
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE tests/kernels/test_tp_sync.py > "$out/words/tests_sync.txt" 2>&1
rc=$?
echo "words tests_sync: exit $rc, $((SECONDS - t0)) s" | tee -a "$out/log.txt"
[ $rc -eq 0 ] || exit 1
profile words 7b
profile words 13b
bash scripts/tp_check.sh "$out/words/check" "${BUDGET:-330}" tests_tp bench_7b bench_13b > "$out/words/tp_check.txt" 2>&1
tail -5 "$out/words/tp_check.txt"
