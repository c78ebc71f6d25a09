# Sourced first by a GPU experiment's script, from the repository root, with the script's arguments: the first,
# OUTDIR, becomes $out; the project runs from this tree (scripts/gpu_env.sh); the clock (SECONDS) starts.
# `reverted DIFF CMD...` runs CMD with DIFF taken out of the tree and puts it back after; `applied DIFF CMD...` runs
# it with DIFF put into the tree and takes it out after; `logged NAME RC` adds
# "NAME: exit RC, <seconds>s" to $out/log.txt; `tuned_bench NAME SECONDS ARGS...` runs `llamafast bench --backend
# triton ARGS` for at most SECONDS, tuning on first use into a folder of its own, into $out/bench_NAME.txt, .json.
set -u
out=${1:?usage: bash SCRIPT OUTDIR ...}
mkdir -p "$out"
. scripts/gpu_env.sh || exit 1
SECONDS=0

reverted() {
  local diff=$1 rc
  shift
  git apply -R "$diff" || return 1
  "$@"
  rc=$?
  git apply "$diff"
  return $rc
}

applied() {
  local diff=$1 rc
  shift
  git apply "$diff" || return 1
  "$@"
  rc=$?
  git apply -R "$diff"
  return $rc
}

logged() { echo "$1: exit $2, ${SECONDS}s" | tee -a "$out/log.txt"; }

tuned_bench() {
  local name=$1 seconds=$2
  shift 2
  LLAMAFAST_TUNE_DIR=$out/tune_$name timeout "$seconds" python3 -m llamafast bench --backend triton \
    --out "$out/bench_$name.json" "$@" > "$out/bench_$name.txt" 2>&1
  logged "bench_$name" $?
}
