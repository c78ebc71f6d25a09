"""The layout budgets: no file over 400 lines, no kernel file over 250; no folder over 1,500 lines of Python (its own
files, not its subfolders'); kernels/ imports nothing of llamafast but llamafast.config."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted(p for d in ("llamafast", "kernels", "scripts", "tests") for p in (ROOT / d).rglob("*.py"))
# llamafast/ and each of its subfolders, kernels/, tests/ (and tests/kernels/), scripts/: every folder with Python.
FOLDERS = sorted({p.parent for p in FILES})
FOLDER_LIMIT = 1500
KERNELS = sorted((ROOT / "kernels").rglob("*.py"))
# What a kernel may import besides its siblings (relative imports) and the standard library.
KERNEL_IMPORTS = {"torch", "triton", "numpy", "llamafast.config"}


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


@pytest.mark.parametrize("path", FILES, ids=_rel)
def test_file_size_budget(path):
    limit = 250 if (ROOT / "kernels") in path.parents else 400
    n = _lines(path)
    assert n <= limit, f"{_rel(path)} has {n} lines (budget {limit})"


@pytest.mark.parametrize("folder", FOLDERS, ids=_rel)
def test_folder_size_budget(folder):
    sizes = {p.name: _lines(p) for p in sorted(folder.glob("*.py"))}
    total = sum(sizes.values())
    assert total <= FOLDER_LIMIT, f"{_rel(folder)}/ holds {total} lines of Python (budget {FOLDER_LIMIT}): {sizes}"


def _allowed(module: str) -> bool:
    top = module.partition(".")[0]
    if top == "llamafast":
        return module == "llamafast.config"
    return top in sys.stdlib_module_names or any(module == m or module.startswith(m + ".") for m in KERNEL_IMPORTS)


def _imports(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) for every import anywhere in the file; relative imports as '.name' (level dots)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                found.append((node.lineno, "." * node.level + (node.module or "")))
            elif node.module == "llamafast":  # from llamafast import config, ...: each name is a module
                found += [(node.lineno, f"llamafast.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, node.module))
    return found


@pytest.mark.parametrize("path", KERNELS, ids=_rel)
def test_kernels_import_only_llamafast_config(path):
    """Kernels stay a leaf: siblings (relative, within kernels/), the standard library, torch, triton, numpy and
    llamafast.config; nothing else of llamafast."""
    bad = []
    depth = len(path.relative_to(ROOT / "kernels").parts)  # 1 in kernels/, 2 in kernels/prefill/
    for line, module in _imports(ast.parse(path.read_text(), filename=str(path))):
        if module.startswith("."):
            ok = not module.startswith("." * (depth + 1))  # more dots would leave kernels/ for llamafast/
        else:
            ok = _allowed(module)
        if not ok:
            bad.append(f"{_rel(path)}:{line} imports {module}")
    assert not bad, "\n".join(bad)
