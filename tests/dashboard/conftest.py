"""Dashboard fixtures: a data directory of contract-shaped demo data, built once."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetlens.pipeline.storage import DataDir
from tests.dashboard.synth import Fleet, build_all

APP = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"


@pytest.fixture(scope="session")
def demo_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[DataDir, Fleet]:
    """A small fleet (4 hosts, 8 GPUs, 2 h) with one injected KV-pressure incident."""
    root = DataDir(tmp_path_factory.mktemp("dash") / "data")
    return root, build_all(root)


@pytest.fixture(scope="session")
def failure_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[DataDir, Fleet]:
    """The demo fleet with failures (:mod:`tests.dashboard.synth_failures`): an engine down
    then restarted, a silent host, and a peer's latency incident the engine's loss set off."""
    root = DataDir(tmp_path_factory.mktemp("dash-failures") / "data")
    return root, build_all(root, Fleet(failures=True))


def app_over(root: DataDir, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """An AppTest of the dashboard over ``root``, already run once."""
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("FLEETLENS_DATA", str(root.root))
    monkeypatch.delenv("FLEETLENS_CONFIG", raising=False)
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


@pytest.fixture
def app(demo_data, monkeypatch: pytest.MonkeyPatch):
    """An AppTest of the dashboard over the demo data, already run once."""
    return app_over(demo_data[0], monkeypatch)


@pytest.fixture
def app_failures(failure_data, monkeypatch: pytest.MonkeyPatch):
    """An AppTest of the dashboard over the data with failures, already run once."""
    return app_over(failure_data[0], monkeypatch)


@pytest.fixture(scope="session")
def real_demo(tmp_path_factory: pytest.TempPathFactory) -> DataDir:
    """Real demo data: ``fleetlens demo --no-dashboard`` (collector, simulator, pipeline,
    analytics as real processes) over 90 simulated minutes with injected incidents."""
    import subprocess
    import sys

    root = tmp_path_factory.mktemp("real-demo") / "demo"
    out = subprocess.run(
        [sys.executable, "-m", "fleetlens", "demo", "--data-dir", str(root), "--minutes", "90",
         "--no-dashboard"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "demo data ready" in out.stdout, out.stdout[-3000:]
    return DataDir(root)
