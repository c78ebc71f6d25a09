"""`bench decode --temperature ...`: decoding timed as it samples (every other figure is greedy), the way of
sampling in the report, and bad sampling options refused in one line."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from llamafast.cli import app

runner = CliRunner()
TINY = ["bench", "decode", "--random-weights", "--shape", "stories260K", "--new-tokens", "8", "--prompt-len", "4",
        "--device", "cpu"]


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_bench_times_sampled_decoding(backend):
    r = runner.invoke(app, [*TINY, "--backend", backend, "--temperature", "0.8", "--top-k", "5", "--json"])
    assert r.exit_code == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["sampling"]["temperature"] == 0.8 and report["sampling"]["top_k"] == 5
    assert report["sampling"]["top_p"] == 0.9  # generate's default beside --temperature
    (row,) = report["results"]
    assert row["backend"] == backend and row["decode_tokens"] == 7 and row["decode_tokens_per_s"] > 0


def test_bench_is_greedy_by_default_and_says_how_it_sampled():
    r = runner.invoke(app, TINY)
    assert r.exit_code == 0, r.stderr
    assert "new 8, KV cache 12; greedy" in " ".join(r.stdout.split())  # the header wraps at the terminal's width
    r = runner.invoke(app, [*TINY, "--temperature", "0.6", "--repetition-penalty", "1.1"])
    assert r.exit_code == 0, r.stderr
    assert "sampling at temperature 0.6, top-p 0.9, repetition penalty 1.1" in " ".join(r.stdout.split())


def test_bench_refuses_bad_sampling_in_one_line():
    r = runner.invoke(app, [*TINY, "--temperature", "1", "--top-p", "0"])
    assert r.exit_code == 1
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: --top-p must be in (0, 1]"] and "Traceback" not in r.stderr
