"""Tuning's progress reaches the caller: runtime.tune shows what the before-tuning hook returns around the sweep
(the CLI's bars, cli/common.py say_tuning), and never where nothing is left to tune."""

from __future__ import annotations

import contextlib

from llamafast import tuning
from llamafast.runtime import tune

from .test_tuning import FakeTimer, _tune_dir, odd_model  # noqa: F401 (_tune_dir: each test its own folder)


def test_the_callers_hook_shows_the_progress_while_the_sweep_runs():
    """runtime.tune enters the context manager the before-tuning hook returns around the sweep, and hands its
    callback the progress; with nothing left to tune it is never entered."""
    events = []

    @contextlib.contextmanager
    def shown():
        events.append("shown")
        yield lambda phase, done, total: events.append(phase)
        events.append("gone")

    tune(odd_model(), lambda plan: shown(), FakeTimer())
    assert events[0] == "shown" and events[-1] == "gone" and tuning.SWEEPING in events
    events.clear()
    tune(odd_model(), lambda plan: shown(), FakeTimer())  # as in a new process: the file has them
    assert events == []
