"""docs/cli.md's "What is refused" table, made from the bad-input test cases (tests/cli/bad_inputs.py), so the
table lists exactly what the tests check. `python scripts/refusals.py` prints it; `--write` puts it into
docs/cli.md between its markers (tests/cli/test_bad_input.py fails while that copy is stale).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "cli.md"
START, END = "<!-- refusals: made by scripts/refusals.py -->", "<!-- /refusals -->"


def table() -> str:
    sys.path.insert(0, str(ROOT))
    from tests.cli.bad_inputs import CASES_BY_GROUP

    rows = ["| input | refused, each with a one-line error and exit code 1 |", "| --- | --- |"]
    for group, cases in CASES_BY_GROUP.items():
        rows.append(f"| {group} | " + "; ".join(f"{c.what} (`{c.command}`)" for c in cases) + " |")
    return "\n".join(rows)


def doc_with_table(doc: str) -> str:
    head, _, rest = doc.partition(START)
    _, _, tail = rest.partition(END)
    return f"{head}{START}\n{table()}\n{END}{tail}"


if __name__ == "__main__":
    if "--write" in sys.argv:
        DOC.write_text(doc_with_table(DOC.read_text()))
    else:
        print(table())
