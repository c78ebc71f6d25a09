"""A GGUF file's tensor types on the command line: those no kernel reads as blocks load as floats, said in one
line on stderr (the types the gguf package cannot dequantize are refused: bad_inputs.py)."""

from __future__ import annotations

from typer.testing import CliRunner

from llamafast.cli import app

from .bad_input_files import gguf

runner = CliRunner()


def _run(*args: str):
    return runner.invoke(app, list(args))


def test_gguf_types_that_no_kernel_reads_as_blocks_load_as_floats_said_in_one_line(tmp_path):
    """Q5_0 (and any type the gguf package dequantizes) loads dequantized; one line on stderr names the types."""
    path = gguf(tmp_path, "Q5_0")
    r = _run("generate", "hi", "--model", str(path), "--device", "cpu", "--max-new-tokens", "4", "--temperature", "0")
    assert r.exit_code == 0, r.stderr
    said = [line for line in r.stderr.splitlines() if "Q5_0" in line]
    assert len(said) == 1 and "m.gguf: Q5_0 x" in said[0] and "dequantized as they load" in said[0]
    r = _run("generate", "hi", "--model", str(gguf(tmp_path, "Q4_0")), "--device", "cpu", "--max-new-tokens", "4")
    assert r.exit_code == 0 and "dequantized as they load" not in r.stderr
