"""Telemetry values in ``fleetlens incidents`` tables are text, never markup or escapes."""

from __future__ import annotations

import json

import polars as pl
from click.testing import CliRunner

from fleetlens.analytics.runner import publish
from fleetlens.cli import cli
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir

NS = 1_000_000_000
HOSTILE_SERVICE = "markup-[/]"
HOSTILE_HOST = "[link=http://evil.example]h01[/link]"
HOSTILE_MODEL = "m\x1b]0;owned\x07"


def test_incidents_table_shows_hostile_names_as_text(tmp_path) -> None:
    root = DataDir(tmp_path / "data")
    start = 1_760_000_000 * NS
    incidents = pl.DataFrame({
        c.INCIDENT_ID: ["abc123"], c.METRIC: ["e2e_p99_s"], c.SERVICE_NAME: [HOSTILE_SERVICE],
        c.MODEL: [HOSTILE_MODEL], c.HOST_NAME: [HOSTILE_HOST], c.START_NS: [start],
        c.END_NS: [start + 600 * NS], c.PEAK: [2.0], c.EXPECTED: [1.0],
        c.SEVERITY: ["major"], c.DETECTOR: ["rolling"],
    }).cast(t.table(t.INCIDENTS).empty().schema)
    causes = pl.DataFrame({
        c.INCIDENT_ID: ["abc123"], c.RANK: [1], c.CAUSE: ["kv_cache_pressure"],
        c.SUBJECT: ["[i]h01[/i]\x1b[2J"], c.SCORE: [1.0],
        c.SHARE_OF_EXCESS: [0.9], c.EVIDENCE: [json.dumps({})], c.SUMMARY: ["s"],
        c.START_NS: [start],
    })
    publish(root, t.INCIDENTS, incidents, c.START_NS)
    publish(root, t.CAUSES, causes, c.START_NS)
    out = CliRunner().invoke(cli, ["incidents", "--data-dir", str(root.root), "--no-refresh"],
                             env={"COLUMNS": "400"})
    assert out.exit_code == 0, out.output
    assert f"{HOSTILE_SERVICE}/{HOSTILE_HOST}" in out.output
    assert "[i]h01[/i]\\x1b[2J" in out.output
    assert "\x1b" not in out.output and "\x07" not in out.output


def test_explain_escapes_control_characters(tmp_path) -> None:
    root = DataDir(tmp_path / "data")
    start = 1_760_000_000 * NS
    incidents = pl.DataFrame({
        c.INCIDENT_ID: ["abc123"], c.METRIC: ["e2e_p99_s"], c.SERVICE_NAME: ["chat"],
        c.MODEL: ["m"], c.HOST_NAME: ["h01\x1b]8;;http://evil.example\x07x"], c.START_NS: [start],
        c.END_NS: [start + 600 * NS], c.PEAK: [2.0], c.EXPECTED: [1.0],
        c.SEVERITY: ["major"], c.DETECTOR: ["rolling"],
    }).cast(t.table(t.INCIDENTS).empty().schema)
    publish(root, t.INCIDENTS, incidents, c.START_NS)
    out = CliRunner().invoke(cli, ["explain", "abc123", "--data-dir", str(root.root)])
    assert out.exit_code == 0, out.output
    assert "h01\\x1b]8;;http://evil.example\\x07x" in out.output
    assert "\x1b" not in out.output and "\x07" not in out.output
