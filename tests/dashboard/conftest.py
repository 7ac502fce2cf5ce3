"""Dashboard fixtures: a data directory of contract-shaped demo data, built once."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.storage import DataDir
from tests.dashboard.synth import Fleet, build_all

APP = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"


@pytest.fixture(scope="session")
def demo_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[DataDir, Fleet]:
    """A small fleet (4 hosts, 8 GPUs, 2 h) with one injected KV-pressure incident."""
    root = DataDir(tmp_path_factory.mktemp("dash") / "data")
    return root, build_all(root)


@pytest.fixture
def app(demo_data, monkeypatch: pytest.MonkeyPatch):
    """An AppTest of the dashboard over the demo data, already run once."""
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("FLEETLENS_DATA", str(demo_data[0].root))
    monkeypatch.delenv("FLEETLENS_CONFIG", raising=False)
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at
