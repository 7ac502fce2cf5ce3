"""``fleetlens demo`` ends with where to go next, and says no false alarm on the way.

The summary test reuses a finished demo directory made here (what a second ``fleetlens demo``
finds), so it runs the real console script in seconds; the end-to-end one builds a real demo
and runs it again.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from fleetlens.analytics.runner import publish
from fleetlens.cli import cli
from fleetlens.demo import DONE, MARKER
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir
from tests.pipeline.rawdata import NS, T0, spans_frame, vllm_span, write_raw

IDS = ("7b11dafbf4ca1216", "a8134fcf195e2d89")


def demo(*args: str, cwd: Path) -> str:
    out = subprocess.run([sys.executable, "-m", "fleetlens", "demo", *args],
                         capture_output=True, text=True, timeout=600, cwd=cwd)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


def _finished_demo(root: Path) -> None:
    """A data directory as a finished `fleetlens demo` leaves it: marker, done file, ground
    truth, and the incidents and causes analytics stored."""
    root.mkdir()
    (root / MARKER).write_text("made by fleetlens demo\n")
    (root / DONE).write_text(json.dumps({"minutes": 90, "skipped": []}) + "\n")
    truth = [{"cause": "kv_cache_pressure", "subject": "host_name=h01"},
             {"cause": "traffic_surge", "subject": "service_name=chat-8b"}]
    (root / "ground-truth.json").write_text(json.dumps({"incidents": truth}))
    start = 1_796_306_340 * NS
    incidents = pl.DataFrame({
        c.INCIDENT_ID: list(IDS), c.METRIC: ["ttft_p50_s", "tpot_p99_s"],
        c.SERVICE_NAME: ["chat-8b"] * 2, c.MODEL: ["m"] * 2, c.HOST_NAME: ["h01", "*"],
        c.START_NS: [start, start + 660 * NS], c.END_NS: [start + 360 * NS, start + 1000 * NS],
        c.PEAK: [3.0, 1.5], c.EXPECTED: [1.0, 1.0], c.SEVERITY: ["critical", "minor"],
        c.DETECTOR: ["rolling"] * 2}).cast(t.table(t.INCIDENTS).empty().schema)
    causes = pl.DataFrame({
        c.INCIDENT_ID: list(IDS), c.RANK: [1, 1], c.CAUSE: [x["cause"] for x in truth],
        c.SUBJECT: [x["subject"] for x in truth], c.SCORE: [1.0, 0.5],
        c.SHARE_OF_EXCESS: [0.9, 0.8], c.EVIDENCE: ["{}"] * 2, c.SUMMARY: ["s"] * 2,
        c.START_NS: [start] * 2})
    publish(DataDir(root), t.INCIDENTS, incidents, c.START_NS)
    publish(DataDir(root), t.CAUSES, causes, c.START_NS)


def test_a_rerun_ends_with_the_incidents_and_the_next_commands(tmp_path: Path) -> None:
    _finished_demo(tmp_path / "demo")
    first = demo("--data-dir", "./demo", "--no-dashboard", cwd=tmp_path)
    for ident in IDS:
        assert ident in first, first
    assert "2 of 2 injected found with the right top cause" in first, first
    # the next commands name the data directory as it was given, to be pasted as they are
    assert "fleetlens incidents --data-dir ./demo" in first, first
    assert f"fleetlens explain {IDS[0]} --data-dir ./demo" in first, first
    assert "fleetlens dashboard --data-dir ./demo" in first, first
    # ... and the commands work from there
    listed = CliRunner().invoke(cli, ["incidents", "--data-dir", str(tmp_path / "demo"),
                                      "--format", "json"])
    assert {row[c.INCIDENT_ID] for row in json.loads(listed.output)} == set(IDS)
    assert demo("--data-dir", "./demo", "--no-dashboard", cwd=tmp_path) == first


def test_late_spans_of_many_hosts_are_said_once_and_not_at_all_for_a_replay(
        tmp_path: Path) -> None:
    """Every host's spans arrive 50 minutes after they end (a replay, or stalled exporters):
    one line for the lot; with --replay (what the demo passes), none."""
    data = DataDir(tmp_path / "data")
    rows = [vllm_span(i, start_ns=T0 + i * NS, host=f"h{i % 5:02d}",
                      received_ns=T0 + i * NS + 3000 * NS) for i in range(20)]
    write_raw(data, t.SPANS, spans_frame(rows), writer="a", seq=1)
    late = CliRunner().invoke(cli, ["pipeline", "--data-dir", str(data.root),
                                    "--no-progress", "--full"])
    assert late.exit_code == 0, late.output
    said = [line for line in late.output.splitlines() if "this is a replay" in line]
    assert len(said) == 1, late.output
    assert re.search(r"5 hosts \(h00, h01, h02, h03, h04\)", said[0]), said
    replay = CliRunner().invoke(cli, ["pipeline", "--data-dir", str(data.root),
                                      "--no-progress", "--full", "--replay"])
    assert replay.exit_code == 0, replay.output
    assert "export delay" not in replay.output, replay.output


@pytest.mark.e2e
@pytest.mark.slow
def test_the_real_demo_prints_its_summary_again_on_a_rerun(tmp_path: Path) -> None:
    built = demo("--data-dir", "./d", "--minutes", "40", "--no-dashboard", cwd=tmp_path)
    assert "export delay" not in built and "this is a replay" not in built, built
    summary = built[built.index("\nfound "):]
    assert "fleetlens incidents --data-dir ./d" in summary, summary
    again = demo("--data-dir", "./d", "--no-dashboard", cwd=tmp_path)
    assert again[again.index("\nfound "):] == summary
