# Sourced first by a GPU experiment's script, from the repository root, with the script's arguments: the first,
# OUTDIR, becomes $out; the project runs from this tree (scripts/gpu_env.sh); the clock (SECONDS) starts.
# `reverted DIFF CMD...` runs CMD with DIFF taken out of the tree and puts it back after; `applied DIFF CMD...` runs
# it with DIFF put into the tree and takes it out after; `logged NAME RC` adds
# "NAME: exit RC, <seconds>s" to $out/log.txt.
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
