"""Heatmap and "what is different about these" (issue 35 item 2): a selection of a search's
requests against the rest, on a fleet whose answer is known: six engine instances on three
hosts, one of them (h2-i1) four times slower for ten minutes."""

from __future__ import annotations

import json
import shlex

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner

from fleetlens.analytics.traces.compare import (
    Selection,
    compare,
    compare_data_dir,
    view_frame,
    view_metric,
)
from fleetlens.analytics.traces.drill import bucket_bounds, command_of, drill_query
from fleetlens.analytics.traces.heatmap import heatmap
from fleetlens.analytics.traces.query import SearchError, TraceQuery
from fleetlens.cli import cli
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import conform
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, connect
from tests.dashboard.synth import write_table

NS = 10**9
T0 = 1_789_999_200 * NS  # a whole hour
SLOW = ("h2-i1", T0 + 1200 * NS, T0 + 1800 * NS)  # instance, [start, end)


def fleet() -> pl.DataFrame:
    """One request every 2 s per instance for an hour; e2e about 1 s, 4 s on the slow one."""
    rng = np.random.default_rng(3)
    rows = []
    for h in (1, 2, 3):
        for i in (0, 1):
            instance = f"h{h}-i{i}"
            for k in range(1800):
                arrival = T0 + k * 2 * NS + h * 1000 + i
                slow = instance == SLOW[0] and SLOW[1] <= arrival < SLOW[2]
                e2e = (4.0 if slow else 1.0) + float(rng.uniform(0, 0.5))
                rows.append({
                    c.REQUEST_ID: f"r-{instance}-{k}", c.TRACE_ID: f"{h}{i}{k:030x}",
                    c.SPAN_ID: f"{k:016x}", c.SERVICE_NAME: "chat", c.MODEL: "m",
                    c.HOST_NAME: f"h{h}", c.INSTANCE_ID: instance, c.ARRIVAL_NS: arrival,
                    c.END_NS: arrival + int(e2e * NS), c.E2E_S: e2e, c.QUEUE_S: e2e - 0.9,
                    c.TTFT_S: e2e / 4, c.TPOT_S: 0.01, c.INPUT_TOKENS: int(rng.integers(10, 900)),
                    c.OUTPUT_TOKENS: 50, c.CACHED_TOKENS: 0, c.IS_ERROR: False,
                    c.FINISH_REASON: "stop", c.REGION: "us" if h == 3 else "eu"})
    return pl.DataFrame(rows)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> DataDir:
    data = DataDir(tmp_path_factory.mktemp("compare") / "data")
    write_table(data, t.REQUESTS, conform(fleet(), t.REQUESTS), c.ARRIVAL_NS)
    return data


SELECTION = Selection(c.E2E_S, SLOW[1], SLOW[2], low=3.0)


def test_the_slow_instance_is_the_top_difference_then_its_host() -> None:
    result = compare(fleet(), SELECTION, TraceQuery())
    assert (result.selected, result.rest) == (300, 6 * 1800 - 300)
    top = [(d.dimension, d.value) for d in result.differences[:2]]
    assert top == [(c.INSTANCE_ID, "h2-i1"), (c.HOST_NAME, "h2")]
    first = result.differences[0]
    assert first.selected_share == 1.0 and first.share_of_excess == pytest.approx(1.0)
    assert first.rest_share == pytest.approx(1500 / 10500)
    assert first.lift == pytest.approx((1 + 0.01) / (1500 / 10500 + 0.01))
    assert all(d.lift > 1 for d in result.differences)
    assert len(first.trace_ids) == 5 and all(tid.startswith("21") for tid in first.trace_ids)


def test_a_band_without_a_time_span_of_its_own_still_finds_it() -> None:
    """The whole hour, every request at 3 s or more: only the slow instance's."""
    result = compare(fleet(), Selection(c.E2E_S, T0, T0 + 3600 * NS, low=3.0))
    assert result.selected == 300 and result.differences[0].value == "h2-i1"


def test_drill_down_searches_open_exactly_the_selected_requests_of_the_value(
        root: DataDir) -> None:
    query = TraceQuery(regions=("eu",))
    result = compare_data_dir(root, query, SELECTION)
    first = result.differences[0]
    assert first.query is not None
    assert first.query.instances == ("h2-i1",) and first.query.regions == ("eu",)
    assert (first.query.start_ns, first.query.end_ns) == (SLOW[1], SLOW[2])
    assert first.query.sort == c.E2E_S and first.query.descending
    con = connect(root, tables=(t.REQUESTS,))
    try:
        opened = view_frame(con, first.query)
    finally:
        con.close()
    assert opened.height == 300 and set(opened[c.INSTANCE_ID]) == {"h2-i1"}


def test_a_prompt_bucket_drills_down_to_a_token_range() -> None:
    assert bucket_bounds("128-512") == (128, 511)
    assert bucket_bounds("<128") == (None, 127)
    assert bucket_bounds(">=32768") == (32768, None)
    query = drill_query(TraceQuery(), SELECTION, c.PROMPT_BUCKET, "128-512")
    assert query is not None
    bounds = {b.column: (b.low, b.high) for b in query.bounds}
    assert bounds == {c.E2E_S: (3.0, None), c.INPUT_TOKENS: (128, 511)}
    assert drill_query(TraceQuery(), SELECTION, c.CACHED_RATIO_BUCKET, "<0.25") is None


def test_the_command_of_a_search_is_one_the_cli_runs(root: DataDir) -> None:
    query = drill_query(TraceQuery(), SELECTION, c.HOST_NAME, "h2")
    assert query is not None
    line = command_of(query, "--data-dir", str(root.root))
    assert line.startswith("fleetlens traces --since ")
    out = CliRunner().invoke(cli, [*shlex.split(line)[1:], "--format", "json"])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.stdout)
    assert len(rows) == 50 and {r[c.INSTANCE_ID] for r in rows} == {"h2-i1"}
    assert "of 300" in out.stderr


def test_the_heatmap_counts_every_request_once_in_minute_buckets() -> None:
    frame = fleet()
    grid = heatmap(frame, c.E2E_S, time_buckets=60, latency_buckets=20)
    assert grid.total == frame.height
    assert grid.time_edges_ns[0] == T0 and grid.time_edges_ns[1] - T0 == 60 * NS
    # log-spaced over at least a decade from 1 s (the fastest is 1.0x s), below 1 s in the
    # first bucket
    assert len(grid.time_edges_ns) == 61
    assert grid.latency_edges[:2] == [0.0, 1.0] and grid.latency_edges[-1] == 10.0
    assert grid.latency_edges[11] == pytest.approx(10 ** (10 / 19), rel=1e-3)
    matrix = grid.matrix()
    assert sum(map(sum, matrix)) == frame.height and sum(matrix[0]) == 0
    # normal requests take 1-1.5 s, the slow instance's 4-4.5 s: no bucket holds both
    slow_rows = [row for edge, row in zip(grid.latency_edges, matrix, strict=False)
                 if edge > 1.5]
    assert sum(map(sum, slow_rows)) == 300 and sum(sum(r[20:30]) for r in slow_rows) == 300
    assert heatmap(frame.head(0), c.E2E_S).total == 0


@pytest.mark.parametrize("kwargs,message", [
    ({"metric": "prefill_s"}, "--metric prefill_s"),
    ({"end_ns": T0}, "time span is empty"),
    ({"low": 2.0, "high": 1.0}, "above --max-latency"),
])
def test_a_bad_selection_is_one_line(kwargs: dict, message: str) -> None:
    args = {"metric": c.E2E_S, "start_ns": T0, "end_ns": T0 + NS, **kwargs}
    with pytest.raises(SearchError, match=message):
        Selection(**args)


def run_compare(root: DataDir, *args: str, fmt: str = "json") -> tuple[str, str]:
    out = CliRunner().invoke(cli, ["traces", "compare", "--data-dir", str(root.root),
                                   "--format", fmt, *args])
    assert out.exit_code == 0, out.output
    return out.stdout, out.stderr


def test_the_cli_names_the_slow_instance_with_a_command_that_opens_it(root: DataDir) -> None:
    stdout, note = run_compare(root, "--metric", c.E2E_S, "--from", str(SLOW[1]),
                               "--to", str(SLOW[2]), "--min-latency", "3", "--region", "eu")
    rows = json.loads(stdout)
    assert [(r["dimension"], r["value"]) for r in rows[:2]] == [
        (c.INSTANCE_ID, "h2-i1"), (c.HOST_NAME, "h2")]
    assert rows[0]["selected_share"] == 1.0 and len(rows[0]["trace_ids"]) == 5
    assert "300 requests selected, 6,900 in the rest" in note  # eu: h1 and h2, 7,200
    opened = CliRunner().invoke(cli, [*shlex.split(rows[0]["command"])[1:], "--format",
                                      "csv", "--limit", "1000"])
    assert opened.exit_code == 0, opened.output
    assert len(opened.stdout.splitlines()) == 301 and "of 300" in opened.stderr
    # The same in CSV and as a table with one command per difference.
    csv_out, _ = run_compare(root, "--from", str(SLOW[1]), "--to", str(SLOW[2]),
                             "--min-latency", "3", fmt="csv")
    assert csv_out.splitlines()[1].startswith("1,instance_id,h2-i1,")
    table, _ = run_compare(root, "--from", str(SLOW[1]), "--to", str(SLOW[2]),
                           "--min-latency", "3", "--top", "3", fmt="table")
    assert "instance_id=h2-i1" in table and "1. fleetlens traces --since" in table
    assert "4. " not in table


def test_the_cli_says_when_nothing_stands_out(root: DataDir) -> None:
    stdout, note = run_compare(root, "--min-latency", "100")
    assert json.loads(stdout) == [] and "0 requests selected" in note


@pytest.mark.parametrize("query", [TraceQuery(), TraceQuery(regions=("eu",)),
                                   TraceQuery(instances=("h2-i1",), start_ns=SLOW[1])],
                         ids=["all", "a region", "an instance from a time"])
def test_the_heatmap_of_two_columns_is_the_heatmap_of_the_whole_view(
        root: DataDir, query: TraceQuery) -> None:
    """The Traces page draws its heatmap from :func:`view_metric` (two columns) and reads the
    whole view only for a comparison: the same requests, the same grid."""
    con = connect(root, tables=(t.REQUESTS,))
    try:
        whole = view_frame(con, query)
        for metric in (c.E2E_S, c.TTFT_S):
            two = view_metric(con, query, metric)
            assert two.columns == [c.ARRIVAL_NS, metric]
            assert two.sort(c.ARRIVAL_NS).equals(whole.select(c.ARRIVAL_NS, metric)
                                                 .sort(c.ARRIVAL_NS))
            mine, theirs = (heatmap(f, metric, min_width_s=60) for f in (two, whole))
            assert mine.total and mine.total == theirs.total
            assert (mine.time_edges_ns, mine.latency_edges) == (theirs.time_edges_ns,
                                                                theirs.latency_edges)
            assert mine.cells.equals(theirs.cells)
        with pytest.raises(SearchError, match="not one of"):
            view_metric(con, query, c.INPUT_TOKENS)
    finally:
        con.close()
