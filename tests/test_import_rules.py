"""Imports flow one way (DESIGN.md section 1): this test parses every module and fails on a
wrong-way arrow, and on column names or attribute keys spelled outside pipeline/schema/."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from fleetlens.pipeline.schema import TABLES, attributes

REPO = Path(__file__).resolve().parents[1]
NS = "fleetlens"
#: repository folder -> installed package (pyproject's package-dir mapping)
FOLDERS = {
    "fleetlens": NS, "collector": f"{NS}.collector", "pipeline": f"{NS}.pipeline",
    "analytics": f"{NS}.analytics", "dashboard": f"{NS}.dashboard",
    "simulator": f"{NS}.simulator",
}
#: top-level names the folders had before they moved under the namespace: importing one
#: would load a second copy of a module, so it is always a violation
OLD_TOP_LEVEL = ("collector", "pipeline", "analytics", "dashboard", "simulator")

_SCHEMA, _STORAGE = f"{NS}.pipeline.schema", f"{NS}.pipeline.storage"
# module prefix -> prefixes of ours it may import (its own package always allowed)
ALLOWED: list[tuple[str, tuple[str, ...]]] = [
    (_SCHEMA, (_SCHEMA,)),
    (_STORAGE, (_SCHEMA, _STORAGE)),
    (f"{NS}.collector", (f"{NS}.collector", _SCHEMA, _STORAGE)),
    (f"{NS}.simulator", (f"{NS}.simulator", _SCHEMA, _STORAGE)),
    (f"{NS}.pipeline", (f"{NS}.pipeline",)),
    (f"{NS}.analytics", (f"{NS}.analytics", f"{NS}.pipeline")),
    (f"{NS}.dashboard", (f"{NS}.dashboard", f"{NS}.analytics", f"{NS}.pipeline")),
    (NS, (NS,)),  # the console script and its helpers may import every component
]


def _modules(root: Path = REPO) -> list[tuple[str, Path]]:
    found = []
    for folder, package in FOLDERS.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = list(path.relative_to(root / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found.append((".".join([package, *parts]), path))
    return found


def _imports(path: Path, module: str) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import: resolve against the module's package
                base = module.split(".")[: -node.level] if path.name != "__init__.py" else (
                    module.split(".")[: len(module.split(".")) - node.level + 1])
                names.append(".".join([*base, node.module] if node.module else base))
            elif node.module:
                names += [f"{node.module}.{alias.name}" for alias in node.names]
    return [n for n in names if n.split(".")[0] in (NS, *OLD_TOP_LEVEL)]


def _rule(module: str) -> tuple[str, ...]:
    for prefix, allowed in ALLOWED:
        if module == prefix or module.startswith(prefix + "."):
            return allowed
    raise AssertionError(f"no import rule covers {module}")


def _violations(root: Path = REPO) -> list[str]:
    bad = []
    for module, path in _modules(root):
        allowed = _rule(module)
        for name in _imports(path, module):
            if not any(name == a or name.startswith(a + ".") for a in allowed):
                bad.append(f"{path.relative_to(root)}: imports {name} (allowed: {allowed})")
    return bad


def test_imports_flow_one_way() -> None:
    assert _violations() == []


def test_the_checker_catches_a_wrong_way_import(tmp_path: Path) -> None:
    # A tree of its own: a probe written into the checkout would race other test runs.
    for folder in FOLDERS:
        (tmp_path / folder).mkdir()
    (tmp_path / "pipeline" / "fine.py").write_text("from fleetlens.pipeline.schema import c\n")
    (tmp_path / "pipeline" / "wrong_way.py").write_text("from fleetlens.analytics import x\n")
    (tmp_path / "collector" / "wrong_too.py").write_text("import fleetlens.pipeline.runner\n")
    (tmp_path / "collector" / "old_name.py").write_text("from pipeline.schema import c\n")
    found = _violations(tmp_path)
    assert len(found) == 3, found
    assert any(v.startswith("pipeline/wrong_way.py: imports fleetlens.analytics") for v in found)
    assert any(v.startswith("collector/wrong_too.py: imports fleetlens.pipeline.runner")
               for v in found)
    assert any(v.startswith("collector/old_name.py: imports pipeline.schema") for v in found)


def _names_owned_by_schema() -> set[str]:
    columns = {name for spec in TABLES.values() for name in spec.columns if "_" in name}
    keys = {
        value for name, value in vars(attributes).items()
        if name.isupper() and isinstance(value, str) and ("." in value or ":" in value)
    }
    return columns | keys


def _docstring_nodes(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


@pytest.mark.parametrize("module,path", [
    (m, p) for m, p in _modules()
    if not m.startswith(_SCHEMA) and p.name != "config.py"
], ids=lambda v: v if isinstance(v, str) else "")
def test_no_schema_names_spelled_outside_schema(module: str, path: Path) -> None:
    owned = _names_owned_by_schema()
    tree = ast.parse(path.read_text())
    docstrings = _docstring_nodes(tree)
    found = sorted({
        node.value for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        and id(node) not in docstrings and node.value in owned
    })
    assert found == [], f"{module} spells schema names as literals: {found}"
