"""No import circles (issue 32 §4): two modules that import each other, even lazily inside a
function, are one module cut in two, and the one-way rule of ``test_import_rules.py`` cannot
see them when both sit in one package. Imports under ``if TYPE_CHECKING:`` are left out:
they never run, and annotations may name each other's types."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_import_rules import REPO, _modules

#: folders of scripts that import each other as ``bench.<name>``
SCRIPT_FOLDERS = ("bench",)


def _all_modules(root: Path) -> dict[str, Path]:
    found = dict(_modules(root))
    for folder in SCRIPT_FOLDERS:
        for path in sorted((root / folder).glob("*.py")):
            found[f"{folder}.{path.stem}"] = path
    return found


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes inside ``if TYPE_CHECKING:`` blocks."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            ids |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return ids


def _imported(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Our modules ``module`` imports at run time (a ``from package import module`` names
    the module; any other name its package or module)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skipped = _type_checking_only(tree)
    names = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".")
                drop = node.level - (path.name == "__init__.py")
                base = ".".join([*package[:len(package) - drop], *([base] if base else [])])
            names |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                      for alias in node.names}
    out = set()
    for name in names:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name and name != module:
            out.add(name)
    return out


def import_circles(root: Path = REPO) -> list[list[str]]:
    """Every group of modules that reach each other by imports (Tarjan's strongly
    connected components with more than one module), each sorted."""
    known = _all_modules(root)
    graph = {m: _imported(m, p, known) for m, p in known.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(circles)


def test_no_module_imports_one_that_imports_it_back() -> None:
    assert import_circles() == []


def test_the_checker_finds_a_lazy_circle_and_ignores_type_checking_imports(
        tmp_path: Path) -> None:
    for folder in ("fleetlens", "collector", "pipeline", "analytics", "dashboard", "simulator",
                   "bench"):
        (tmp_path / folder).mkdir()
    (tmp_path / "analytics" / "one.py").write_text("from fleetlens.analytics import two\n")
    (tmp_path / "analytics" / "two.py").write_text(
        "def f():\n    from fleetlens.analytics.one import g\n")
    (tmp_path / "simulator" / "a.py").write_text("from fleetlens.simulator.b import B\n")
    (tmp_path / "simulator" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from fleetlens.simulator.a import A\nclass B: ...\n")
    (tmp_path / "bench" / "x.py").write_text("from bench.y import z\n")
    (tmp_path / "bench" / "y.py").write_text("def z():\n    import bench.x\n")
    assert import_circles(tmp_path) == [["bench.x", "bench.y"],
                                        ["fleetlens.analytics.one", "fleetlens.analytics.two"]]
