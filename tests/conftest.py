"""Shared fixtures. ``SHARED`` is the read-only ../shared folder beside the repository."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


def shared_file(*parts: str) -> Path:
    """A file of the outside data in ../shared, or a skip that names it.

    CI has ../shared beside the clone; a user's fresh clone does not, and its ``make test``
    must still pass, so a test that needs outside data says which file it needs and skips."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"needs the outside data file ../shared/{'/'.join(parts)}, "
                    "which is not beside this clone")
    return path


@pytest.fixture(autouse=True)
def _no_inherited_terminal_width(monkeypatch: pytest.MonkeyPatch) -> None:
    """pytest-xdist's workers run with ``COLUMNS=80`` where a plain run has none, and the
    CLI lays tables out for ``$COLUMNS`` (pipeline.terminal.table_width): each test starts
    without it, as under a plain run; a test that wants a width sets it."""
    monkeypatch.delenv("COLUMNS", raising=False)


@pytest.fixture
def data_dir(tmp_path: Path):
    """An empty fleetlens data directory."""
    from fleetlens.pipeline.storage import DataDir

    return DataDir(tmp_path / "data")


#: Test files that must not run at the same time as each other, by unit. ``make test`` keeps
#: them apart itself (tests/run_suite.py); under a plain ``pytest -n N`` each unit's files
#: run one after the other on one worker. Two CPU vLLM servers at once would each serve half
#: of what their calibration measured; two Ray clusters on one machine at once found each
#: other's nodes ("No node info found matching attributes").
SERIAL_UNITS = {
    # The Ray files run after the real-vLLM ones on the same worker, never beside them: a
    # CPU vLLM server at load plus two Ray clusters starved everything (load 18-22 on 2
    # cores: a Ray head timed out starting, the agent's exports missed their deadline).
    "real-vllm": ("tests/agent/test_vllm_incidents.py", "tests/agent/test_vllm_e2e.py",
                  "tests/agent/test_vllm_capacity.py",
                  "tests/analytics/test_ray_analyze.py", "tests/pipeline/test_ray_runner.py",
                  "tests/pipeline/test_object_store_e2e.py"),
}
_UNIT_OF = {path: unit for unit, paths in SERIAL_UNITS.items() for path in paths}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The real-vLLM files first: the longest unit of work starts first (xdist hands out
    work in collection order), so the suite's wall time is about the longer of the two."""
    items.sort(key=lambda item: _UNIT_OF.get(item.nodeid.split("::", 1)[0]) != "real-vllm")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Whole files per worker (module fixtures, such as a simulated fleet or a started
    collector, are built once), and each of :data:`SERIAL_UNITS` as one unit of work."""
    from xdist.scheduler import LoadFileScheduling

    class SerialUnitsScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return _UNIT_OF.get(path, path)

    config.option.loadscopereorder = False  # keep the collection order set above
    return SerialUnitsScheduling(config, log)
