"""`fleetlens pipeline --follow` as a real process, the @stage wrapper, and config errors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import polars as pl
import pytest

from fleetlens.pipeline.cli import load_pipeline_config
from fleetlens.pipeline.schema import SchemaError
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.schema.settings import ConfigError
from fleetlens.pipeline.stage import STATS, stage
from fleetlens.pipeline.storage import DataDir, connect
from tests.pipeline.fleet import make_fleet, write_batches


def _requests(dd: DataDir) -> int:
    return connect(dd).sql("select count(*) from requests").fetchall()[0][0]


@pytest.mark.e2e
def test_follow_picks_up_new_segments(tmp_path) -> None:
    dd = DataDir(tmp_path / "data")
    fleet = make_fleet(seed=5, seconds=200)
    write_batches(dd, fleet, range(0, 2))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETLENS_")}
    log_path = tmp_path / "pipeline.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fleetlens", "pipeline", "--data-dir", str(dd.root),
             "--follow", "--interval", "0.2", "--json"], stdout=log, stderr=subprocess.STDOUT,
            env=env)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (dd.state / "pipeline.json").exists():
            time.sleep(0.1)
        first = _requests(dd)
        assert first > 0
        write_batches(dd, fleet, range(2, 4))
        while time.monotonic() < deadline and _requests(dd) < fleet.distinct_requests:
            time.sleep(0.2)
        assert _requests(dd) == fleet.distinct_requests > first
    finally:
        os.kill(proc.pid, signal.SIGINT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    output = log_path.read_text()
    assert proc.returncode == 0, output
    assert '"new_segments": 4' in output and "stopped" in output


def test_stage_wrapper_validates_and_counts() -> None:
    @stage(t.REQUEST_ENERGY)
    def good(frame: pl.DataFrame) -> pl.DataFrame:
        return t.table(t.REQUEST_ENERGY).empty()

    @stage(t.REQUEST_ENERGY)
    def bad(frame: pl.DataFrame) -> pl.DataFrame:
        return frame

    STATS.reset()
    good(pl.DataFrame({"x": [1, 2, 3]}))
    assert [(r.name, r.rows_in, r.rows_out) for r in STATS.records] == [("good", 3, 0)]
    with pytest.raises(SchemaError, match="request_energy"):
        bad(pl.DataFrame({"x": [1]}))
    assert STATS.totals()["good"].rows_in == 3


def test_config_file_env_and_overrides(tmp_path, monkeypatch) -> None:
    cfg_file = tmp_path / "fleetlens.toml"
    cfg_file.write_text('[pipeline]\nwindow_s = 300\ndimensions = ["region", "gpu=hw.model"]\n')
    monkeypatch.setenv("FLEETLENS_PIPELINE__LATENESS_S", "42")
    cfg = load_pipeline_config(str(cfg_file))
    assert (cfg.window_s, cfg.lateness_s) == (300, 42)
    assert cfg.dimension_map() == {"region": "region", "gpu": "hw.model"}
    assert load_pipeline_config(str(cfg_file), window_s=10).window_s == 10
    with pytest.raises(ConfigError, match="energy_slot_s"):
        load_pipeline_config(str(cfg_file), window_s=15, energy_slot_s=10)
    cfg_file.write_text("[pipeline]\nwindow_secs = 60\n")
    with pytest.raises(ConfigError, match="did you mean 'window_s'"):
        load_pipeline_config(str(cfg_file))


def test_summary_names_only_hosts_whose_export_delay_looks_wrong(capsys) -> None:
    from fleetlens.pipeline.cli import _print_summary
    from fleetlens.pipeline.runner import RunSummary

    delays = {"fine-1": 0.4, "fine-2": 3.2, "ahead": -612.0, "behind": 900.0}
    _print_summary(RunSummary(new_segments=1, export_delay_s=delays), as_json=False)
    lines = capsys.readouterr().out.splitlines()
    assert "-612.0 to 900.0 s over 4 hosts" in lines[1]
    assert [line.split(":")[0].strip() for line in lines[2:]] == ["host ahead", "host behind"]
    assert "ahead of the collector's" in lines[2] and "behind the collector's" in lines[3]


@pytest.mark.parametrize("damage", ["garbage", "[]", '{"version": 1, "segments": {"x": 5}}'])
def test_a_damaged_state_file_is_named_and_full_rebuilds_it(tmp_path, damage: str) -> None:
    from click.testing import CliRunner

    from fleetlens.cli import cli

    dd = DataDir(tmp_path / "data")
    write_batches(dd, make_fleet(seed=1, seconds=60))
    runner = CliRunner()
    base = ["--data-dir", str(dd.root)]
    assert runner.invoke(cli, ["pipeline", *base, "--no-progress"]).exit_code == 0
    (dd.state / "pipeline.json").write_text(damage)
    for command in ("pipeline", "compact"):
        out = runner.invoke(cli, [command, *base])
        assert out.exit_code == 1 and "pipeline.json is unreadable" in out.output, out.output
        assert "--full" in out.output  # what to do
        assert isinstance(out.exception, SystemExit)  # a clean exit, not a traceback
    rebuilt = runner.invoke(cli, ["pipeline", *base, "--full", "--no-progress"])
    assert rebuilt.exit_code == 0 and "8 new segments" in rebuilt.output, rebuilt.output
    again = runner.invoke(cli, ["pipeline", *base, "--no-progress"])
    assert again.exit_code == 0 and again.output.startswith("0 new segments"), again.output


def test_a_damaged_raw_segment_is_named_by_every_command_that_reads_it(tmp_path) -> None:
    from click.testing import CliRunner

    from fleetlens.cli import cli

    dd = DataDir(tmp_path / "data")
    write_batches(dd, make_fleet(seed=1, seconds=60))
    runner = CliRunner()
    base = ["--data-dir", str(dd.root)]
    assert runner.invoke(cli, ["pipeline", *base, "--no-progress"]).exit_code == 0
    damaged = sorted((dd.root / "raw" / "spans").rglob("*.parquet"))[0]
    with open(damaged, "r+b") as handle:
        handle.truncate(500)  # e.g. a copy cut short outside fleetlens
    config = tmp_path / "keep.toml"  # the fleet's fixed date would be expired by retention
    config.write_text("[pipeline]\nraw_retention_days = 36500\ncompact_min_age_s = 0\n")
    name = str(damaged.relative_to(dd.root))
    for command in (["pipeline"], ["pipeline", "--full"], ["compact", "--config", str(config)],
                    ["sql", "select count(*) from spans"]):
        out = runner.invoke(cli, [*command, *base])
        assert out.exit_code == 1 and isinstance(out.exception, SystemExit), (command, out)
        assert name in out.output, (command, out.output)
    damaged.rename(tmp_path / damaged.name)  # moved aside, as the message says
    rebuilt = runner.invoke(cli, ["pipeline", *base, "--full", "--no-progress"])
    assert rebuilt.exit_code == 0 and "7 new segments" in rebuilt.output, rebuilt.output


def test_pipeline_and_compact_take_the_one_format_flag(tmp_path) -> None:  # noqa: ANN001
    import json as _json

    from click.testing import CliRunner

    from fleetlens.cli import cli

    data = tmp_path / "data"
    data.mkdir()
    for command in (["pipeline", "--no-progress"], ["compact", "--dry-run"]):
        out = CliRunner().invoke(cli, [*command, "--data-dir", str(data), "--format", "json"])
        assert out.exit_code == 0, out.output
        assert isinstance(_json.loads(out.stdout.strip().splitlines()[-1]), dict)
        old = CliRunner().invoke(cli, [*command, "--data-dir", str(data), "--json"])
        assert old.exit_code == 0 and old.stdout.strip().startswith("{")  # kept, hidden
