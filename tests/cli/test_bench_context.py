"""`bench decode --context N`: each run holds a KV cache of N positions, as chat and serve hold the model's
context, and the report says how many."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from llamafast.cli import app

runner = CliRunner()
TINY = ["bench", "decode", "--random-weights", "--shape", "stories260K", "--new-tokens", "8", "--prompt-len", "4",
        "--device", "cpu", "--backend", "reference"]


def test_the_cache_holds_context_positions(monkeypatch):
    from llamafast.generate import Engine

    sizes = []
    real = Engine.__init__

    def spy(self, model, sampling, max_seq_len, *a, **kw):
        sizes.append(max_seq_len)
        real(self, model, sampling, max_seq_len, *a, **kw)

    monkeypatch.setattr(Engine, "__init__", spy)
    r = runner.invoke(app, [*TINY, "--context", "300", "--json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["context"] == 300 and sizes == [300]


def test_the_cache_holds_the_prompt_and_new_tokens_by_default():
    r = runner.invoke(app, TINY)
    assert r.exit_code == 0, r.stderr
    assert "prompt 4, new 8, KV cache 12; greedy" in " ".join(r.stdout.split())  # the header wraps
