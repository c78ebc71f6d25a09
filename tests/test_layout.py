"""The layout: no file over 400 lines, no kernel file over 250; llamafast's packages import downwards only, floor by
floor (FLOORS), and no two of them import each other, however indirectly; kernels/ imports nothing of llamafast but
llamafast.config."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted(p for d in ("llamafast", "kernels", "scripts", "tests") for p in (ROOT / d).rglob("*.py"))
# Bottom to top: a module may import from its own floor and the ones below. The top-level modules of llamafast/
# each name their floor; a package's modules all stand on its floor.
FLOORS = [
    ("config", ["llamafast.config", "llamafast.errors", "llamafast.settings", "llamafast"]),
    ("kernels", ["llamafast.kernels"]),
    ("model", ["llamafast.model", "llamafast.reference", "llamafast.backends", "llamafast.quant", "llamafast.sampling",
               "llamafast.sparse", "llamafast.measure"]),
    ("formats", ["llamafast.formats"]),
    ("tokenizers", ["llamafast.tokenizers"]),
    ("tuning", ["llamafast.tuning"]),
    ("load", ["llamafast.load"]),
    ("runtime", ["llamafast.runtime", "llamafast.generate", "llamafast.prompt_graph", "llamafast.prompt_cache",
                 "llamafast.chat", "llamafast.tp"]),
    ("tools", ["llamafast.bench", "llamafast.tools", "llamafast.serve"]),
    ("cli", ["llamafast.cli", "llamafast.__main__"]),
]
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


def _module(path: Path) -> str:
    """The import name of a file of llamafast/ or kernels/ (llamafast.kernels)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    parts = ["llamafast", *parts] if parts[0] == "kernels" else parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _floor(module: str) -> int:
    """The index in FLOORS of the longest name that module is or lies under."""
    best = max((len(name), i) for i, (_, names) in enumerate(FLOORS) for name in names
               if module == name or module.startswith(name + "."))
    return best[1]


def _unit(module: str) -> str:
    """What the cycle rule counts as one: a package of llamafast (llamafast.load) or a top-level module."""
    return ".".join(module.split(".")[:2])


def _llamafast_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) for each import of llamafast in the file, relative ones resolved."""
    package = _module(path) if path.name == "__init__.py" else _module(path).rpartition(".")[0]
    tree = ast.parse(path.read_text(), filename=str(path))
    typing_only = {n.lineno for block in ast.walk(tree) if isinstance(block, ast.If) and _is_type_checking(block.test)
                   for stmt in block.body for n in ast.walk(stmt) if hasattr(n, "lineno")}
    found = []
    for line, module in _imports(tree):
        if line in typing_only:  # annotations only: nothing is imported when the program runs
            continue
        if module.startswith("."):
            dots = len(module) - len(module.lstrip("."))
            base = package.split(".")[: len(package.split(".")) - dots + 1]
            module = ".".join(base + ([module.lstrip(".")] if module.lstrip(".") else []))
        if module.split(".")[0] == "llamafast":
            found.append((line, module))
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


LLAMAFAST = sorted((ROOT / "llamafast").rglob("*.py")) + KERNELS


def test_imports_go_down_the_floors():
    bad = []
    for path in LLAMAFAST:
        here = _floor(_module(path))
        for line, module in _llamafast_imports(path):
            if _floor(module) > here:
                bad.append(f"{_rel(path)}:{line} ({FLOORS[here][0]}) imports {module} ({FLOORS[_floor(module)][0]})")
    assert not bad, "\n".join(bad)


def test_no_two_packages_import_each_other():
    """Not even through others: the graph of packages and top-level modules has no cycle."""
    graph: dict[str, set[str]] = {}
    for path in LLAMAFAST:
        me = _unit(_module(path))
        graph.setdefault(me, set()).update(u for _, m in _llamafast_imports(path) if (u := _unit(m)) != me)
    done: set[str] = set()

    def visit(unit: str, trail: list[str]) -> None:
        assert unit not in trail, "import cycle: " + " -> ".join(trail[trail.index(unit):] + [unit])
        if unit not in done:
            for nxt in sorted(graph.get(unit, ())):
                visit(nxt, trail + [unit])
            done.add(unit)

    for unit in sorted(graph):
        visit(unit, [])


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


def test_every_package_is_installed():
    """pyproject.toml lists the packages by name: a new one left out works in a checkout and is missing from a
    wheel."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {_module(p) for p in LLAMAFAST if p.name == "__init__.py"}
    assert found <= listed, f"not in pyproject.toml's packages: {sorted(found - listed)}"
