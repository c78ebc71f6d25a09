"""llamafast/settings.py: every LLAMAFAST_* variable parsed in one place; the spellings each accepts, the defaults,
and a new value seen as soon as the environment changes (the refusals are cases in tests/cli/bad_inputs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamafast.errors import SharedError
from llamafast.settings import Settings, settings


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for name in ("LLAMAFAST_TUNE", "LLAMAFAST_TUNE_DIR", "LLAMAFAST_PRELOAD", "LLAMAFAST_LOAD_THREADS",
                 "LLAMAFAST_TP_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)


def test_defaults(monkeypatch):
    assert settings() == Settings(tune=True, tune_dir=None, preload=True, load_threads=4, tp_timeout_s=60.0)
    for name in ("LLAMAFAST_TUNE", "LLAMAFAST_LOAD_THREADS", "LLAMAFAST_TP_TIMEOUT"):
        monkeypatch.setenv(name, "")  # set but empty: as if unset
    assert settings() == Settings()


@pytest.mark.parametrize(("text", "on"), [("1", True), ("true", True), (" YES ", True), ("on", True),
                                          ("0", False), ("False", False), ("no", False), ("off", False)])
def test_switch_spellings(monkeypatch, text, on):
    monkeypatch.setenv("LLAMAFAST_TUNE", text)
    monkeypatch.setenv("LLAMAFAST_PRELOAD", text)
    assert settings().tune is on and settings().preload is on


def test_values_follow_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("LLAMAFAST_TUNE_DIR", str(tmp_path))
    monkeypatch.setenv("LLAMAFAST_LOAD_THREADS", "8")
    monkeypatch.setenv("LLAMAFAST_TP_TIMEOUT", "2.5")
    assert settings() == Settings(tune_dir=Path(tmp_path), load_threads=8, tp_timeout_s=2.5)
    monkeypatch.setenv("LLAMAFAST_LOAD_THREADS", "2")
    assert settings().load_threads == 2


@pytest.mark.parametrize(("name", "text"), [("LLAMAFAST_TUNE", "2"), ("LLAMAFAST_PRELOAD", "disabled"),
                                            ("LLAMAFAST_LOAD_THREADS", "65"), ("LLAMAFAST_LOAD_THREADS", "-1"),
                                            ("LLAMAFAST_TP_TIMEOUT", "inf"), ("LLAMAFAST_TP_TIMEOUT", "0")])
def test_garbage_is_one_error_naming_the_variable(monkeypatch, name, text):
    monkeypatch.setenv(name, text)
    with pytest.raises(SharedError, match=name):
        settings()
