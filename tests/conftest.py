"""Shared fixtures. ``SHARED`` is the read-only ../shared folder beside the repository."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


@pytest.fixture
def data_dir(tmp_path: Path):
    """An empty fleetlens data directory."""
    from fleetlens.pipeline.storage import DataDir

    return DataDir(tmp_path / "data")
