"""Bad input, command by command: each case of tests/cli/bad_inputs.py ends in exit code 1, exactly one `error:`
line on stderr naming the problem, and no traceback; a refused command writes and removes nothing.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from llamafast.cli import app
from llamafast.load import bundled_model

from .bad_input_case import Case
from .bad_input_files import hf, truncate
from .bad_inputs import CASES

ROOT = Path(__file__).resolve().parents[2]


def assert_clean_error(r, needle: str) -> None:
    """Exit code 1, exactly one `error:` line on stderr containing needle, no traceback anywhere."""
    err = r.stderr
    assert r.exit_code == 1, (r.exit_code, r.stdout[-500:], err[-2000:])
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err + r.stdout, err
    assert needle in lines[0], lines[0]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_refused(case: Case, tmp_path: Path):
    if case.needs is not None and not case.needs.is_dir():
        pytest.skip(f"needs {case.needs}")
    if case.needle == "cuda:9" and torch.cuda.device_count() > 9:
        pytest.skip("this machine has a tenth GPU")
    marker = Path(tempfile.gettempdir()) / "llamafast-pickle-ran"
    shutil.rmtree(marker, ignore_errors=True)
    args = case.setup(tmp_path)
    before = _snapshot(tmp_path)
    r = CliRunner().invoke(app, [*case.command.split(), *args], input=case.stdin, env=case.env)
    assert_clean_error(r, case.needle)
    assert not marker.exists(), "the pickled object ran"
    assert _snapshot(tmp_path) == before, "a refused command wrote or removed files"


def _snapshot(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def test_convert_overlap_keeps_the_source_intact(tmp_path):
    """Defect 1: `convert-fp8 same same --force` destroyed the Hugging Face checkpoint."""
    src = hf(tmp_path)
    files = {p.name: p.read_bytes() for p in src.iterdir()}
    assert_clean_error(CliRunner().invoke(app, ["convert-fp8", str(src), str(src), "--force"]), "overlaps")
    assert {p.name: p.read_bytes() for p in src.iterdir()} == files


def test_convert_on_a_read_only_file_system(tmp_path, monkeypatch):
    """EROFS from the file system (simulated: this machine has no read-only mount to write to)."""

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    r = CliRunner().invoke(app, ["convert-fp8", str(bundled_model()), str(tmp_path / "out")])
    assert_clean_error(r, "Read-only file system")


@pytest.mark.slow
def test_out_of_memory_says_how_much(tmp_path):
    """7B random weights on the CPU under `ulimit -v 16000000`: the needed and the available bytes, one line."""
    script = "ulimit -v 16000000; exec " + " ".join(
        [sys.executable, "-m", "llamafast", "bench", "--random-weights", "--shape", "llama-2-7b", "--device", "cpu"]
    )
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=300)
    lines = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert r.returncode == 1 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "need 27.0 GB of host memory" in lines[0] and "available" in lines[0], lines[0]


def test_stories_files_are_refused_when_truncated(tmp_path, stories_copies):
    """stories260K's Hugging Face copy (the stories_copies fixture), truncated (the cases above use synthetic
    checkpoints)."""
    shutil.copytree(stories_copies / "hf", tmp_path / "hf")
    truncate(tmp_path / "hf" / "model.safetensors", 500_000)
    assert_clean_error(CliRunner().invoke(app, ["generate", "hi", "--model", str(tmp_path / "hf")]), "truncated")


def test_cli_doc_lists_what_is_refused():
    """docs/cli.md's table is made from CASES: `python scripts/refusals.py --write` after adding a case."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import refusals

    doc = refusals.DOC.read_text()
    assert refusals.START in doc and doc == refusals.doc_with_table(doc)
