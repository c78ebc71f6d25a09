"""What the CliRunner harness cannot express, run in a real process: a standard output that is full (/dev/full)
or closed (>&-), a full standard error. Each command ends in exactly one `error:` line and exit code 1, never a
traceback; a checkpoint written before its report stays; a full stderr never stops the output on stdout."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llamafast.cli import app
from llamafast.load import bundled_model

from .test_bad_input import assert_clean_error

CALIBRATION = Path(__file__).resolve().parents[1] / "data" / "stories260K_calibration.txt"
CPU = ["--device", "cpu"]
pytestmark = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")


def _run(args: list[str], redirect: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """llamafast ARGS with the shell redirection given (`>/dev/full`, `>&-`, `2>/dev/full`)."""
    command = " ".join(["exec", sys.executable, "-m", "llamafast", *map(_quote, args), redirect])
    return subprocess.run(["bash", "-c", command], input=stdin, capture_output=True, text=True, timeout=300)


def _quote(arg: str) -> str:
    return "'" + arg.replace("'", "'\\''") + "'"


def _assert_one_error(r: subprocess.CompletedProcess, needle: str) -> None:
    lines = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert r.returncode == 1 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert needle in lines[0], lines[0]


WRITES = {  # command -> (arguments, standard input)
    "generate": (["generate", "Hi", "--max-new-tokens", "4", *CPU], None),
    "generate --json": (["generate", "Hi", "--max-new-tokens", "4", "--json", *CPU], None),
    "chat": (["chat", "--max-new-tokens", "4", *CPU], "Hello\nAgain\n"),
    "info": (["info"], None),
    "eval": (["eval", "--prompts", "1", "--tokens", "8", "--variant", "fp8_e5m2", *CPU], None),
}


@pytest.mark.slow
@pytest.mark.parametrize("redirect, needle", [(">/dev/full", "No space left on device"), (">&-", "closed")])
@pytest.mark.parametrize("name", WRITES)
def test_stdout_full_or_closed(name, redirect, needle):
    args, stdin = WRITES[name]
    _assert_one_error(_run(args, redirect, stdin), needle)


@pytest.mark.slow
@pytest.mark.parametrize("redirect", [">/dev/full", ">&-"])
@pytest.mark.parametrize("command", ["convert-fp8", "sparsify"])
def test_checkpoint_stays_when_its_report_cannot_be_written(tmp_path, command, redirect):
    extra = ["--text", str(CALIBRATION), "--group-size", "4"] if command == "sparsify" else []
    r = _run([command, str(bundled_model()), str(tmp_path / "out"), *CPU, *extra], redirect)
    _assert_one_error(r, "cannot write the output")
    assert (tmp_path / "out" / "model.safetensors").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


@pytest.mark.slow
@pytest.mark.parametrize("redirect", ["2>/dev/full", "2>&-"])
def test_a_full_stderr_never_stops_the_output(redirect):
    r = _run(["generate", "Once upon a time", "--max-new-tokens", "8", "--temperature", "0"], redirect)
    assert r.returncode == 0 and len(r.stdout.strip()) > 0, (r.returncode, r.stdout)


def test_out_on_a_disk_that_fills_during_the_run(tmp_path, monkeypatch):
    """--out passed the check before the run; writing it at the end fails (ENOSPC, simulated): one error line,
    and no partial file."""
    def full(fd, *args, **kwargs):
        os.close(fd)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fdopen", full)
    r = CliRunner().invoke(app, ["bench", "--random-weights", "--shape", "stories260K", *CPU, "--new-tokens", "4",
                                 "--out", str(tmp_path / "r.json")])
    assert_clean_error(r, "No space left on device")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["cv[/x]", "cv[bold]"])
def test_paths_with_rich_markup_are_printed_as_they_are(tmp_path, name):
    """A path is text, never Rich markup: `[/x]` raised a MarkupError, `[bold]` vanished from the message."""
    r = CliRunner().invoke(app, ["convert-fp8", str(bundled_model()), str(tmp_path / name), *CPU])
    assert r.exit_code == 0 and f"wrote {tmp_path / name} (" in r.stderr, r.stderr
    text = tmp_path / f"{name}.txt"
    text.write_text("Once upon a time there was a little girl. " * 4)
    r = CliRunner().invoke(app, ["eval", "--text", str(text), "--variant", "fp8_e5m2", *CPU])
    assert r.exit_code == 0 and f"text {text}, its first" in r.stdout.replace("\n", ""), (r.stdout, r.stderr)
