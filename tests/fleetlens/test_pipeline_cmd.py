"""`fleetlens pipeline` runs analytics after a run when asked (and by default with --follow)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fleetlens.pipeline.cli import make_pipeline_command
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, existing_tables
from tests.pipeline.fleet import make_fleet, write_batches


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETLENS_")}
    return subprocess.run([sys.executable, "-m", "fleetlens", "pipeline", *args],
                          capture_output=True, text=True, timeout=300, env=env)


def test_pipeline_with_analyze_publishes_baselines(tmp_path: Path) -> None:
    dd = DataDir(tmp_path / "data")
    # 30 one-minute windows: enough history for the rolling baselines (20 windows).
    write_batches(dd, make_fleet(seed=3, seconds=1800), range(0, 4))
    out = _run("--data-dir", str(dd.root), "--no-progress", "--analyze")
    assert out.returncode == 0, out.stderr
    assert "analytics:" in out.stderr and "incidents" in out.stderr
    assert t.REQUESTS in existing_tables(dd)
    assert t.BASELINES in existing_tables(dd)
    assert (dd.state / "analytics" / "provenance.json").exists()


def test_single_run_does_not_analyze_by_default(tmp_path: Path) -> None:
    dd = DataDir(tmp_path / "data")
    write_batches(dd, make_fleet(seed=4, seconds=120), range(0, 1))
    out = _run("--data-dir", str(dd.root), "--no-progress")
    assert out.returncode == 0, out.stderr
    assert "analytics:" not in out.stderr
    assert t.BASELINES not in existing_tables(dd)


def test_pipeline_package_alone_hides_the_analyze_option() -> None:
    plain = make_pipeline_command()
    analyze = next(p for p in plain.params if p.name == "analyze")
    assert analyze.hidden
