"""Filters are bound parameters: values full of SQL metacharacters select exactly what a
reference Polars filter selects, and never change the query."""

from __future__ import annotations

import polars as pl
import pytest

from fleetlens.dashboard import explore, incident, queries, ranking
from fleetlens.dashboard.filters import Filters, where
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, connect, scan, write_parquet_atomic
from tests.dashboard.synth import SERVICES

HOSTILE = [
    SERVICES[1],
    "'; DROP TABLE requests; --",
    "x' OR '1'='1",
    '"; select 1; --',
    "$p_service_name",
    "\\'",
    "%_*?",
    "naïve ☃ \x00",
]


@pytest.fixture(scope="module")
def con(demo_data):
    return connect(demo_data[0])


@pytest.mark.parametrize("value", HOSTILE)
def test_service_filter_matches_polars_reference(con, demo_data, value: str) -> None:
    root = demo_data[0]
    f = Filters(services=(value,))
    clause, params = where(con, f, time_col=c.ARRIVAL_NS)
    plain, _ = where(con, Filters(services=("plain",)), time_col=c.ARRIVAL_NS)
    assert clause == plain  # the value never reaches the SQL text
    assert [value] in params.values()
    got = queries.run(con, f"SELECT {c.REQUEST_ID} FROM {t.REQUESTS} WHERE {clause}", params)
    ref = scan(root, t.REQUESTS).filter(pl.col(c.SERVICE_NAME) == value).collect()
    assert sorted(got[c.REQUEST_ID]) == sorted(ref[c.REQUEST_ID])
    assert queries.run(con, f"SELECT count(*) AS n FROM {t.REQUESTS}", {})["n"][0] > 0


def test_combined_filters_match_polars_reference(con, demo_data) -> None:
    root, fleet = demo_data
    start = fleet.start_ns + 1800 * 10**9
    end = start + 3600 * 10**9
    f = Filters(start, end, services=(SERVICES[1], "o'x"), models=("qwen-7b",),
                regions=("us-east",))
    clause, params = where(con, f, time_col=c.ARRIVAL_NS)
    got = queries.run(con, f"SELECT {c.REQUEST_ID} FROM {t.REQUESTS} WHERE {clause}", params)
    ref = scan(root, t.REQUESTS).filter(
        pl.col(c.ARRIVAL_NS).is_between(start, end, closed="left")
        & pl.col(c.SERVICE_NAME).is_in([SERVICES[1], "o'x"])
        & (pl.col(c.MODEL) == "qwen-7b") & (pl.col(c.REGION) == "us-east")).collect()
    assert ref.height > 0
    assert sorted(got[c.REQUEST_ID]) == sorted(ref[c.REQUEST_ID])


def test_unknown_region_matches_nothing(con) -> None:
    f = Filters(regions=("' OR 1=1 --",))
    assert queries.fleet_series(con, f).is_empty()
    assert queries.incidents(con, f).is_empty()


def test_fleet_series_sums_service_rows_once(con, demo_data) -> None:
    series = queries.fleet_series(con, Filters())
    requests = scan(demo_data[0], t.REQUESTS).select(pl.len()).collect().item()
    assert series[c.REQUESTS].sum() == requests
    by_host = queries.fleet_series(con, Filters(hosts=tuple(f"gpu-host-{i:02d}" for i in range(4))))
    assert by_host[c.REQUESTS].sum() == requests


def test_incident_queries_on_hostile_ids(con) -> None:
    assert incident.incident(con, "' OR '1'='1") is None
    assert queries.causes(con, "x' OR 1=1 --").is_empty()
    assert explore.find_trace(con, "' OR 1=1 --").is_empty()


def test_baseline_series_parsed_when_columns_absent(tmp_path) -> None:
    root = DataDir(tmp_path / "d")
    frame = pl.DataFrame({
        c.SERIES: ["e2e_p99_s{service_name=a,model=m,host_name=h1}", "rps{service_name=a}"],
        c.TS_NS: [1, 2], c.EXPECTED: [1.0, 2.0], c.LOWER: [0.5, 1.0], c.UPPER: [2.0, 3.0],
        c.METHOD: ["rolling", "prophet"],
    })
    write_parquet_atomic(frame, root.derived(t.BASELINES) / "b.parquet")
    got = queries.baseline_series(connect(root), Filters())
    assert got.select(c.METRIC, c.SERVICE_NAME, c.MODEL, c.HOST_NAME).rows() == [
        ("e2e_p99_s", "a", "m", "h1"), ("rps", "a", t.FLEET_WIDE, t.FLEET_WIDE)]


def test_empty_data_dir_gives_empty_frames(tmp_path) -> None:
    con = connect(DataDir(tmp_path / "empty"))
    f = Filters()
    assert queries.extent(con) == (None, None)
    assert queries.fleet_series(con, f).is_empty()
    assert queries.incidents(con, f).is_empty()
    assert explore.kv_instances(con, f).is_empty()
    assert ranking.ranked(con, f).is_empty()


def test_leaderboard_ranks_with_intervals_and_a_front(con) -> None:
    board = ranking.ranked(con, Filters())
    assert board.height == 2
    assert sorted(board[c.RANK]) == [1, 2]
    assert (board[c.RANK_LO] <= board[c.RANK]).all()
    assert (board[c.RANK] <= board[c.RANK_HI]).all()
    assert board[c.PARETO].any()


def test_waterfall_puts_phases_inside_the_engine_span(con, demo_data) -> None:
    req = scan(demo_data[0], t.REQUESTS).head(1).collect().row(0, named=True)
    spans = explore.find_trace(con, req[c.TRACE_ID])
    bars = explore.waterfall(spans, explore.trace_requests(con, req[c.TRACE_ID]))
    engine = bars.filter(pl.col("kind") == "span").sort("start_ms")[-1].row(0, named=True)
    phases = bars.filter(pl.col("kind") != "span")
    assert phases["kind"].to_list() == ["queue", "prefill", "decode"]
    assert phases["start_ms"][0] == pytest.approx(engine["start_ms"])
    total = phases["duration_ms"].sum()
    assert total == pytest.approx(1000 * (req[c.QUEUE_S] + req[c.PREFILL_S] + req[c.DECODE_S]))
    assert total <= engine["duration_ms"] + 1e-6


def test_find_trace_by_trace_or_request_id_with_and_without_time_hint(con, demo_data) -> None:
    req = scan(demo_data[0], t.REQUESTS).slice(100, 1).collect().row(0, named=True)
    full = explore.find_trace(con, req[c.TRACE_ID])
    assert full.height == 2  # gateway + engine span
    assert explore.find_trace(con, req[c.TRACE_ID].upper()).equals(full)
    assert explore.find_trace(con, req[c.REQUEST_ID]).equals(full)
    hinted = explore.find_trace(con, req[c.REQUEST_ID], req[c.ARRIVAL_NS])
    assert hinted.equals(full)
    # a wrong hint finds nothing rather than something else
    assert explore.find_trace(con, req[c.TRACE_ID], req[c.ARRIVAL_NS] + 10 * 3600 * 10**9
                              ).is_empty()
    reqs = explore.trace_requests(con, req[c.TRACE_ID], req[c.ARRIVAL_NS])
    assert reqs[c.REQUEST_ID].to_list() == [req[c.REQUEST_ID]]


def test_cache_epoch_moves_only_when_data_changed_and_ttl_passed(tmp_path) -> None:
    import os

    from fleetlens.dashboard.data import cache_epoch

    root = DataDir(tmp_path / "d")
    state = root.state / "pipeline.json"
    state.parent.mkdir(parents=True)
    state.write_text("{}")
    first = cache_epoch(root, 30, now=1000.0)
    assert cache_epoch(root, 30, now=5000.0) == first  # quiet data: stays cached
    os.utime(state, ns=(1, state.stat().st_mtime_ns + 10**9))  # the pipeline published
    assert cache_epoch(root, 30, now=5010.0) == first + 1  # old enough: re-read
    os.utime(state, ns=(1, state.stat().st_mtime_ns + 10**9))
    assert cache_epoch(root, 30, now=5020.0) == first + 1  # too soon: at most every ttl
    assert cache_epoch(root, 30, now=5041.0) == first + 2


def test_host_peak_power_is_of_the_host_total_not_a_sum_of_gpu_peaks(tmp_path) -> None:
    from fleetlens.pipeline.schema import conform

    root = DataDir(tmp_path / "d")
    ns = 10**9
    # GPU A peaks at 300 W in second 0, GPU B in second 1: the host never draws 600 W.
    rows = {c.TS_NS: [0, ns // 2, ns, ns + ns // 2] * 2,
            c.HOST_NAME: ["h"] * 8, c.GPU_UUID: ["GPU-A"] * 4 + ["GPU-B"] * 4,
            c.GPU_MODEL: ["H100"] * 8, c.POWER_W: [300.0, 300.0, 100.0, 100.0,
                                                  100.0, 100.0, 300.0, 300.0],
            c.POWER_LIMIT_W: [350.0] * 8, c.UTIL_GPU: [0.9] * 8}
    frame = conform(pl.DataFrame(rows), t.GPU_SAMPLES)
    write_parquet_atomic(frame, root.partition_path(t.GPU_SAMPLES, date="1970-01-01") / "a.parquet")
    (host,) = explore.power_vs_limit(connect(root), Filters()).to_dicts()
    assert host[c.HOST_NAME] == "h" and host["gpus"] == 2
    assert host["peak_power_w"] == pytest.approx(400.0)
    assert host["mean_power_w"] == pytest.approx(400.0) and host["power_limit_w"] == 700.0


def test_an_incidents_slowest_requests_are_by_its_own_metric(con) -> None:
    inc = incident.incident(con, "5f3a9c0e1b2d4a67")  # the synthetic e2e_p99_s incident
    by_e2e = incident.slowest_requests(con, inc, limit=50)
    assert by_e2e[c.E2E_S].to_list() == sorted(by_e2e[c.E2E_S].to_list(), reverse=True)
    as_ttft = incident.slowest_requests(con, {**inc, c.METRIC: "ttft_p50_s"}, limit=50)
    ttft = as_ttft[c.TTFT_S].drop_nulls().to_list()
    assert ttft and ttft == sorted(ttft, reverse=True)
    assert as_ttft[c.REQUEST_ID].to_list() != by_e2e[c.REQUEST_ID].to_list()


def test_request_latency_column_of_a_window_percentile() -> None:
    assert [c.request_latency_column(x) for x in (
        "ttft_p99_s", "e2e_p50_s", "queue_p90_s", "rps", "kv_cache_usage_max", "ttft_p42_s",
        "ttft_s")] == ["ttft_s", "e2e_s", "queue_s", None, None, None, None]


def test_dashboard_connection_has_views_for_exactly_the_tables_its_pages_read(demo_data
                                                                              ) -> None:
    """Raw metric points and logs (most files of a live directory) get no view: making one
    reads every file's footer. Every table a page query names must have one."""
    import re
    from pathlib import Path

    from fleetlens.dashboard import data

    pages = Path(data.__file__).parent
    named = set()
    for path in [*pages.glob("*.py"), *pages.glob("views/*.py")]:
        if path.name != "sql_console.py":  # the console has its own connection
            named |= set(re.findall(r"\bt\.([A-Z_]+)\b", path.read_text()))
    used = {getattr(t, n) for n in named if isinstance(getattr(t, n, None), str)
            and getattr(t, n) in t.TABLES}
    assert used <= set(data.DASHBOARD_TABLES), used - set(data.DASHBOARD_TABLES)
    con = data._connection(str(demo_data[0].root), data.present_tables(demo_data[0]))
    views = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables")
             .fetchall()}
    assert views == set(data.DASHBOARD_TABLES)
    assert t.METRIC_POINTS not in views
