"""``fleetlens traces diff`` (issue 35 item 4): two requests side by side, or one against the
median request of its service around its arrival, with the engine's queue depth, batch and
KV usage when it arrived. The fleet of tests/analytics/test_traces_compare.py, whose slow
instance (h2-i1) also had 7 requests waiting during its slow ten minutes."""

from __future__ import annotations

import json

import polars as pl
import pytest
from click.testing import CliRunner

from fleetlens.analytics.traces.side_by_side import median_row, request_row, side_by_side
from fleetlens.cli import cli
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import conform
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, connect
from tests.analytics.test_traces_compare import NS, SLOW, T0, fleet
from tests.dashboard.synth import write_table


def engine_samples() -> pl.DataFrame:
    """A sample every 10 s per instance: 1 waiting (7 on the slow one while slow), 20
    running, KV 40%."""
    rows = []
    for instance in (f"h{h}-i{i}" for h in (1, 2, 3) for i in (0, 1)):
        for k in range(360):
            ts = T0 + k * 10 * NS
            slow = instance == SLOW[0] and SLOW[1] <= ts < SLOW[2]
            rows.append({c.TS_NS: ts, c.HOST_NAME: instance[:2], c.INSTANCE_ID: instance,
                         c.MODEL: "m", c.NUM_WAITING: 7.0 if slow else 1.0,
                         c.NUM_RUNNING: 20.0, c.KV_CACHE_USAGE: 0.4})
    return pl.DataFrame(rows)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> DataDir:
    data = DataDir(tmp_path_factory.mktemp("diff") / "data")
    write_table(data, t.REQUESTS, conform(fleet(), t.REQUESTS), c.ARRIVAL_NS)
    write_table(data, t.ENGINE_SAMPLES, conform(engine_samples(), t.ENGINE_SAMPLES), c.TS_NS)
    return data


#: A request of the slow instance in its slow ten minutes, and one of a healthy instance.
SLOW_REQ, OK_REQ = "r-h2-i1-700", "r-h1-i0-700"


def test_two_requests_side_by_side(root: DataDir) -> None:
    con = connect(root, tables=(t.REQUESTS, t.ENGINE_SAMPLES))
    try:
        a, b = request_row(con, SLOW_REQ), request_row(con, OK_REQ)
        by_trace = request_row(con, a[c.TRACE_ID])
    finally:
        con.close()
    assert by_trace[c.REQUEST_ID] == SLOW_REQ
    rows = {r["field"]: r for r in side_by_side(a, b).iter_rows(named=True)}
    assert rows[c.E2E_S]["a"] == pytest.approx(a[c.E2E_S]) and rows[c.E2E_S]["a"] > 4
    assert rows[c.E2E_S]["difference"] == pytest.approx(a[c.E2E_S] - b[c.E2E_S])
    assert (rows[c.NUM_WAITING]["a"], rows[c.NUM_WAITING]["b"]) == (7.0, 1.0)
    assert rows[c.NUM_RUNNING]["ratio"] == 1.0 and rows[c.KV_CACHE_USAGE]["a"] == 0.4
    assert rows[c.CACHED_TOKENS]["ratio"] is None  # 0 cached tokens: no ratio


def test_a_request_against_the_median_of_its_service_around_it(root: DataDir) -> None:
    out = CliRunner().invoke(cli, ["traces", "diff", SLOW_REQ, "--data-dir", str(root.root),
                                   "--window", "60", "--format", "json"])
    assert out.exit_code == 0, out.output
    rows = {r["field"]: r for r in json.loads(out.stdout)}
    # 60 s around it: 30 requests of each of six instances, one slow instance in six
    assert rows[c.NUM_WAITING]["b"] == 1.0 and rows[c.E2E_S]["b"] < 2
    assert rows[c.NUM_WAITING]["a"] == 7.0 and rows[c.E2E_S]["a"] > 4
    assert "median of 180 chat requests within 60 s" in out.stderr
    con = connect(root, tables=(t.REQUESTS, t.ENGINE_SAMPLES))
    try:
        median = median_row(con, request_row(con, SLOW_REQ), 60 * NS)
    finally:
        con.close()
    assert median["requests"] == 180


def test_the_table_and_a_bad_id(root: DataDir) -> None:
    out = CliRunner().invoke(cli, ["traces", "diff", SLOW_REQ, OK_REQ, "--data-dir",
                                   str(root.root)])
    assert out.exit_code == 0, out.output
    assert "A: r-h2-i1-700 (h2 h2-i1)" in out.stdout and "num_waiting" in out.stdout
    bad = CliRunner().invoke(cli, ["traces", "diff", "nope", "--data-dir", str(root.root)])
    assert bad.exit_code == 1 and "'nope': no request or trace" in bad.output
