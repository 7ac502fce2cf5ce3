"""Compaction keeps every row and the pipeline's outputs; retention expires old hours."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from click.testing import CliRunner

from fleetlens.cli import cli
from fleetlens.pipeline.compact import compact
from fleetlens.pipeline.config import PipelineConfig
from fleetlens.pipeline.runner import OUTPUTS, Pipeline
from fleetlens.pipeline.storage import DataDir, connect, parquet_files
from tests.pipeline.fleet import make_fleet, write_batches
from tests.pipeline.rawdata import HOUR_NS, T0


def _digest(dd: DataDir) -> dict[str, str]:
    return {str(p.relative_to(dd.root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for table in OUTPUTS for p in parquet_files(dd.derived(table))}


def _counts(dd: DataDir) -> tuple[int, int]:
    con = connect(dd)
    return (con.sql("select count(*) from spans").fetchall()[0][0],
            con.sql("select count(*) from metric_points").fetchall()[0][0])


def test_compaction_merges_small_segments_without_changing_outputs(tmp_path) -> None:
    dd = DataDir(tmp_path / "data")
    write_batches(dd, make_fleet(seed=3, seconds=400))
    job = Pipeline(dd, PipelineConfig())
    job.run_once()
    before_files = len(list(parquet_files(dd.root / "raw")))
    before_rows, before_outputs = _counts(dd), _digest(dd)
    now = T0 + 10 * HOUR_NS
    summary = compact(dd, PipelineConfig(), now_ns=now)
    assert summary.merged_files == before_files and summary.written_files == 2
    assert len(list(parquet_files(dd.root / "raw"))) == 2  # one per signal and hour
    assert _counts(dd) == before_rows
    # the state knows the merged files: nothing to recompute, outputs unchanged
    assert job.run_once().dirty_hours == 0
    assert job.run_once(full=True).new_segments == 2
    assert _digest(dd) == before_outputs


def test_young_hours_are_left_alone_and_dry_run_changes_nothing(tmp_path) -> None:
    dd = DataDir(tmp_path / "data")
    write_batches(dd, make_fleet(seed=3, seconds=400))
    files = sorted(parquet_files(dd.root / "raw"))
    assert compact(dd, PipelineConfig(), now_ns=T0 + HOUR_NS).merged_files == 0
    dry = compact(dd, PipelineConfig(), now_ns=T0 + 10 * HOUR_NS, dry_run=True)
    assert dry.merged_files == len(files)
    assert sorted(parquet_files(dd.root / "raw")) == files


def test_retention_expires_raw_and_derived_hours(tmp_path) -> None:
    dd = DataDir(tmp_path / "data")
    write_batches(dd, make_fleet(seed=3, seconds=400))
    Pipeline(dd, PipelineConfig()).run_once()
    cfg = PipelineConfig(raw_retention_days=1, windows_retention_days=3)
    two_days_later = T0 + 2 * 24 * HOUR_NS + 2 * HOUR_NS
    summary = compact(dd, cfg, now_ns=two_days_later)
    assert summary.expired_raw_hours == 2
    assert list(parquet_files(dd.root / "raw")) == []
    con = connect(dd)
    assert con.sql("select count(*) from requests").fetchall()[0][0] == 0
    assert con.sql("select count(*) from windows").fetchall()[0][0] > 0  # kept 3 days
    # a full rerun over no raw data keeps the windows that retention kept
    Pipeline(dd, cfg).run_once(full=True)
    assert connect(dd).sql("select count(*) from windows").fetchall()[0][0] > 0
    compact(dd, cfg, now_ns=two_days_later + 2 * 24 * HOUR_NS)
    assert connect(dd).sql("select count(*) from windows").fetchall()[0][0] == 0


def test_cli_pipeline_then_compact(tmp_path) -> None:
    dd = DataDir(tmp_path / "data")
    write_batches(dd, make_fleet(seed=4, seconds=120))
    runner = CliRunner()
    out = runner.invoke(cli, ["pipeline", "--data-dir", str(dd.root), "--no-progress"])
    assert out.exit_code == 0, out.output
    assert "8 new segments" in out.output and "requests" in out.output
    again = runner.invoke(cli, ["pipeline", "--data-dir", str(dd.root), "--window-s", "10"])
    assert again.exit_code == 0 and "hours recomputed" in again.output  # new window: full run
    rows = connect(dd).sql("select distinct window_s from windows").fetchall()
    assert rows == [(10,)]
    bad = runner.invoke(cli, ["pipeline", "--data-dir", str(dd.root), "--window-s", "7"])
    assert bad.exit_code != 0 and "window_s" in bad.output
    # The data is from a fixed past date: keep it from expiring, and merge hours of any age.
    config = tmp_path / "fleetlens.toml"
    config.write_text("[pipeline]\nwindow_s = 10\nraw_retention_days = 36500\n"
                      "windows_retention_days = 36500\ncompact_min_age_s = 0\n")
    base = ["compact", "--data-dir", str(dd.root), "--config", str(config)]
    before = _digest(dd)
    dry = runner.invoke(cli, [*base, "--dry-run"])
    assert dry.exit_code == 0 and "would merge 8 segments" in dry.output, dry.output
    assert _digest(dd) == before
    done = runner.invoke(cli, base)
    assert done.exit_code == 0 and "merged 8 segments into 2 files" in done.output, done.output
    rerun = runner.invoke(cli, ["pipeline", "--data-dir", str(dd.root), "--config", str(config),
                                "--no-progress"])
    assert rerun.exit_code == 0 and "0 hours recomputed" in rerun.output, rerun.output
    assert _digest(dd) == before


def test_a_compaction_killed_between_publish_and_delete_changes_no_output(
        tmp_path, monkeypatch) -> None:
    """Reliability R2, mid-compaction: the merged file is published, some small segments
    are still there (their rows twice in raw) and the state was not saved. The pipeline's
    outputs do not change, and the next compaction finishes the job."""
    dd = DataDir(tmp_path / "data")
    write_batches(dd, make_fleet(seed=5, seconds=400))
    job = Pipeline(dd, PipelineConfig())
    job.run_once()
    outputs, spans = _digest(dd), _counts(dd)[0]
    small = len(list(parquet_files(dd.root / "raw")))
    deleted = []
    real_unlink = Path.unlink

    def dies_after_two(path: Path, missing_ok: bool = False) -> None:
        if len(deleted) == 2:
            raise SystemExit("killed mid-compaction")  # nothing after this point runs
        deleted.append(path)
        real_unlink(path, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", dies_after_two)
    later = T0 + 10 * HOUR_NS
    with pytest.raises(SystemExit):
        compact(dd, PipelineConfig(), now_ns=later)
    monkeypatch.undo()
    files = list(parquet_files(dd.root / "raw"))
    assert len(files) == small - 2 + 1  # the merged file beside what was not deleted yet
    assert _counts(dd)[0] > spans  # rows twice in raw, for now

    summary = job.run_once()
    assert summary.dirty_hours > 0  # the merged file is new to the state: its hour is redone
    assert _digest(dd) == outputs  # ... to the same bytes, duplicates removed

    compact(dd, PipelineConfig(), now_ns=later)
    assert len(list(parquet_files(dd.root / "raw"))) == 2  # one per signal and hour
    assert _counts(dd)[0] == spans
    job.run_once()
    assert _digest(dd) == outputs
    assert job.run_once(full=True).new_segments == 2
    assert _digest(dd) == outputs


def test_compact_every_runs_as_a_service_until_sigterm(tmp_path) -> None:
    import os
    import signal
    import subprocess
    import sys

    dd = DataDir(tmp_path / "data")
    write_batches(dd, make_fleet(seed=4, seconds=60))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETLENS_")}
    child = subprocess.Popen([sys.executable, "-m", "fleetlens", "compact", "--data-dir",
                              str(dd.root), "--every", "60", "--json"],
                             env=env, stdout=subprocess.PIPE, text=True)
    try:
        first = child.stdout.readline()  # the first round, at once
        assert '"merged_files"' in first, first
        child.send_signal(signal.SIGTERM)  # between rounds: stops without waiting the minute
        assert child.wait(timeout=30) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
