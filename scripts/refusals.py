"""README's "What llamafast refuses" table, made from the bad-input test cases (tests/cli/bad_inputs.py), so the
table lists exactly what the tests check. `python scripts/refusals.py` prints it; `--write` puts it into
README.md between its markers (tests/cli/test_bad_input.py fails while the README's copy is stale).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- refusals: made by scripts/refusals.py -->", "<!-- /refusals -->"


def table() -> str:
    sys.path.insert(0, str(ROOT))
    from tests.cli.bad_inputs import CASES_BY_GROUP

    rows = ["| input | refused, each with a one-line error and exit code 1 |", "| --- | --- |"]
    for group, cases in CASES_BY_GROUP.items():
        rows.append(f"| {group} | " + "; ".join(f"{c.what} (`{c.command}`)" for c in cases) + " |")
    return "\n".join(rows)


def readme_with_table(readme: str) -> str:
    head, _, rest = readme.partition(START)
    _, _, tail = rest.partition(END)
    return f"{head}{START}\n{table()}\n{END}{tail}"


if __name__ == "__main__":
    if "--write" in sys.argv:
        path = ROOT / "README.md"
        path.write_text(readme_with_table(path.read_text()))
    else:
        print(table())
