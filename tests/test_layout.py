"""The size budgets of STYLE.md: no file over 400 lines, no kernel file over 250."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted(p for d in ("llamafast", "kernels", "scripts", "tests") for p in (ROOT / d).rglob("*.py"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_file_size_budget(path):
    limit = 250 if path.parent.name == "kernels" and path.parent.parent == ROOT else 400
    n = len(path.read_text().splitlines())
    assert n <= limit, f"{path.relative_to(ROOT)} has {n} lines (budget {limit})"
