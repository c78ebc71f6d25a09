"""Prompts read from files and standard input that never end (/dev/zero): a subprocess each, since the CliRunner
cannot hand over a device file as standard input. The address space is capped so that reading without a bound
fails the test in seconds instead of filling the host's memory."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # a subprocess each
LIMIT = "ulimit -v 8000000; "  # 8 GB of address space: torch and the model fit, an endless prompt does not


@pytest.mark.parametrize("how", ["--prompt-file /dev/zero", "- < /dev/zero"])
def test_an_endless_prompt_is_refused(how):
    script = f"{LIMIT}exec {sys.executable} -m llamafast generate --device cpu {how}"
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120)
    lines = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert r.returncode == 1 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "holds more than 16 MiB" in lines[0], lines[0]
