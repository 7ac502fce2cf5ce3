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
