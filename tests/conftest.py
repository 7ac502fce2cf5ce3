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


@pytest.fixture
def data_dir(tmp_path: Path):
    """An empty fleetlens data directory."""
    from fleetlens.pipeline.storage import DataDir

    return DataDir(tmp_path / "data")


#: Test files that share one real vLLM server's machine time. ``make test`` runs the suite on
#: two pytest-xdist workers: these files run one after the other on one worker (two CPU
#: vLLM servers at once would each serve half of what their calibration measured), first,
#: while the other worker runs the rest of the suite.
SERIAL_VLLM_FILES = ("tests/agent/test_vllm_incidents.py", "tests/agent/test_vllm_e2e.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The real-vLLM files first: the longest unit of work starts first (xdist hands out
    work in collection order), so the suite's wall time is about the longer of the two."""
    items.sort(key=lambda item: item.nodeid.split("::", 1)[0] not in SERIAL_VLLM_FILES)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Whole files per worker (module fixtures, such as a simulated fleet or a started
    collector, are built once), and the real-vLLM files as one unit."""
    from xdist.scheduler import LoadFileScheduling

    class VllmSerialScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return "real-vllm" if path in SERIAL_VLLM_FILES else path

    config.option.loadscopereorder = False  # keep the collection order set above
    return VllmSerialScheduling(config, log)
