"""Start-up work cut to what a run needs: `--help` and `--version` of every command import no torch (the option
types live in llamafast.config; commands import what they run inside their functions)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # every test starts python -m llamafast
COMMANDS = ["", "generate", "bench", "eval", "convert-fp8", "info", "sparsify", "chat"]


def _imports(*args: str) -> set[str]:
    """The top-level packages a `python -X importtime -m llamafast ARGS` run imported."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "llamafast", *args], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return {line.rsplit("|", 1)[1].strip().split(".")[0] for line in done.stderr.splitlines()
            if line.startswith("import time:") and "|" in line}


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c or "llamafast")
def test_help_imports_no_torch(command):
    modules = _imports(*([command] if command else []), "--help")
    assert "llamafast" in modules
    assert not modules & {"torch", "triton", "numpy", "safetensors", "sentencepiece"}, sorted(modules)


def test_version_imports_no_torch():
    assert "torch" not in _imports("--version")
