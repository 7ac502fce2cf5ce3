"""The package as pip installs it: one namespace, extras that keep the agent light, one version,
and a clear word when a command needs an extra that is not installed."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
#: what a GPU host must never have to install for the agent (issue 14)
HEAVY = ("prophet", "streamlit", "plotly", "duckdb", "polars", "pyarrow")

# A meta-path finder that makes the heavy packages look uninstalled, in a child interpreter.
BLOCK = """
import importlib.abc, sys
class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition('.')[0] in {names!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Blocked())
"""


def _requirement_names(extra: str | None) -> set[str]:
    """Distribution names that ``fleetlens[extra]`` installs (base included), following the
    extras that refer to other extras of fleetlens."""
    project = PYPROJECT["project"]
    names, todo = set(), [None, extra]
    seen: set[str | None] = set()
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        reqs = project["dependencies"] if current is None else \
            project["optional-dependencies"][current]
        for req in reqs:
            name = req.split(";")[0].split("[")[0].split(">")[0].split("<")[0].split("=")[0]
            if name.strip() == "fleetlens":
                todo += req.split("[", 1)[1].split("]")[0].split(",")
            else:
                names.add(name.strip().lower())
    return names


def _run_blocked(names: tuple[str, ...], code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK.format(names=names) + code],
                          capture_output=True, text=True, timeout=120)


def test_every_package_folder_is_installed_under_the_namespace() -> None:
    tool = PYPROJECT["tool"]["setuptools"]
    mapping: dict[str, str] = tool["package-dir"]
    declared = set(tool["packages"])
    on_disk = set()
    for package, folder in mapping.items():
        for init in (REPO / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / folder).parts
            on_disk.add(".".join([package, *rel]))
    assert declared == on_disk
    assert all(name == "fleetlens" or name.startswith("fleetlens.") for name in declared)


def test_the_agent_extra_installs_nothing_heavy() -> None:
    agent = _requirement_names("agent")
    assert "nvidia-ml-py" in agent and "opentelemetry-sdk" in agent
    assert not agent & set(HEAVY), agent & set(HEAVY)
    everything = _requirement_names("all")
    assert set(HEAVY) <= everything  # the heavy ones do exist, in the other extras


def test_the_agent_runs_without_the_heavy_packages() -> None:
    code = ("import pkgutil, importlib, fleetlens.collector.agent as agent\n"
            "for mod in pkgutil.walk_packages(agent.__path__, 'fleetlens.collector.agent.'):\n"
            "    importlib.import_module(mod.name)\n"
            "from fleetlens.cli import cli\n"
            "cli(['agent', '--help'], prog_name='fleetlens')\n")
    out = _run_blocked(HEAVY, code)
    assert out.returncode == 0, out.stderr
    assert "--collector" in out.stdout


def test_a_command_whose_extra_is_missing_says_which_to_install(tmp_path: Path) -> None:
    out = _run_blocked(("duckdb", "polars"), "from fleetlens.cli import cli\n"
                       f"cli(['sql', '--data-dir', {str(tmp_path)!r}, 'select 1'], "
                       "prog_name='fleetlens')\n")
    assert out.returncode == 1, out.stderr
    assert "fleetlens[server]" in out.stderr and "Traceback" not in out.stderr


def test_the_version_is_read_from_the_installed_metadata() -> None:
    out = subprocess.run([sys.executable, "-m", "fleetlens", "--version"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0
    assert out.stdout.split()[-1] == PYPROJECT["project"]["version"]


@pytest.mark.slow
def test_the_wheel_holds_one_namespace_with_pages_and_scenarios(tmp_path: Path) -> None:
    """Built as pip builds it (isolated, setuptools from PyPI): every module is under
    fleetlens/, and the files Streamlit and the simulator read at run time are inside."""
    # From a copy: setuptools leaves build/ (a second copy of every module) in its source.
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for folder in PYPROJECT["tool"]["setuptools"]["package-dir"].values():
        shutil.copytree(REPO / folder, source / folder,  # the kernel built here left out too
                        ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                          "-w", str(tmp_path), str(source)], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    (wheel,) = tmp_path.glob("fleetlens-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.startswith("fleetlens-")}
    assert tops == {"fleetlens"}, tops
    for needed in ("fleetlens/collector/wal.py", "fleetlens/pipeline/schema/columns.py",
                   "fleetlens/dashboard/app.py", "fleetlens/dashboard/views/overview.py",
                   "fleetlens/simulator/scenarios/quick.toml", "fleetlens/demo.toml"):
        assert needed in names, needed
    assert not any("/tests/" in n or n.startswith("tests/") for n in names)
    # The span kernel is compiled by the wheel's own build where a compiler and Python's
    # headers are (both are on every machine here); its C sources are not shipped.
    if shutil.which("cc") and (Path(sysconfig.get_paths()["include"]) / "Python.h").exists():
        assert any(n.startswith("fleetlens/collector/_spankernel.") and n.endswith(".so")
                   for n in names), [n for n in names if "spankernel" in n]
