# Sourced on a GPU machine whose image has torch and triton but not this project: runs llamafast from this tree
# without installing it. llamafast.kernels and llamafast.configs are the top-level kernels/ and configs/
# (pyproject's package-dir), linked where an installed copy has them, and removed when the shell that linked them
# exits; wheels the image lacks (gguf) come from .whl/ into /tmp/llamafast-site; a `llamafast` command goes first
# on PATH.
#   . scripts/gpu_env.sh
# Only the shell that made the links removes them: a script that sources this again (gpu_check.sh, tp_check.sh)
# leaves them to the shell that ran it. The removal runs before the shell's own EXIT trap, kept (a command that
# tars its results on exit still does).
_llamafast_exit_trap() { eval "set -- $(trap -p EXIT)"; printf '%s' "${3:-}"; }
if [ ! -e llamafast/kernels ]; then
  ln -sfn ../kernels llamafast/kernels && ln -sfn ../configs llamafast/configs
  _llamafast_links="rm -f $(printf '%q %q' "$PWD/llamafast/kernels" "$PWD/llamafast/configs")"
  _llamafast_trap=$(_llamafast_exit_trap)
  trap "$_llamafast_links${_llamafast_trap:+; $_llamafast_trap}" EXIT
fi
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/llamafast-site \
    .whl/*.whl || return 1
fi
mkdir -p /tmp/llamafast-bin
command -v python >/dev/null || ln -sf "$(command -v python3)" /tmp/llamafast-bin/python  # the recipes call python
printf '#!/bin/sh\nexec python3 -m llamafast "$@"\n' > /tmp/llamafast-bin/llamafast && chmod +x /tmp/llamafast-bin/llamafast
export PYTHONPATH=$PWD:/tmp/llamafast-site PATH=/tmp/llamafast-bin:$PATH PYTHONUNBUFFERED=1
export LLAMAFAST_TESTDATA=${LLAMAFAST_TESTDATA:-$PWD/.testdata}
