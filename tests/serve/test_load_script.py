"""scripts/serve_load.py, the GPU load script, runs end to end on the CPU with the bundled model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ENV

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_serve_load_script_on_the_cpu(tmp_path):
    out = tmp_path / "load.json"
    args = ["--device", "cpu", "--prompt-tokens", "64", "--turns", "3", "--reply-tokens", "8", "--new-tokens", "24",
            "--reps", "2", "--generate-reps", "1", "--out", str(out)]
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "serve_load.py"), *args], capture_output=True,
                          text=True, env=ENV, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["serve_exit_code"] == 0 and report["generate"]["decode_tokens_per_s"] > 0
    assert report["serve_decode"]["decode_tokens_per_s"] > 0 and report["ttft"]["prompt_tokens"] == 64
    cached = [t["cached_tokens"] for t in report["conversation"]]
    assert cached[0] < cached[1] < cached[2]  # each turn finds the one before it in the cache
    assert "first token, 64-token prompt over HTTP" in done.stdout
