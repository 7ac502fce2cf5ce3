"""The numbers on the pages are analytics' numbers (one definition of each), computed here
independently from the Parquet files with the analytics functions the CLI calls."""

from __future__ import annotations

import polars as pl
import pytest

from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.leaderboard import leaderboard, outside_incidents, prepare
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import scan
from tests.dashboard.test_pages import frames, open_page


def _steady_board(root) -> pl.DataFrame:  # noqa: ANN001
    """What ``fleetlens leaderboard`` computes, on the requests the page says it ranks: all of
    them but the newest window's and those during an incident of their scope."""
    newest = scan(root, t.WINDOWS).select(pl.col(c.WINDOW_START_NS).max()).collect().item()
    requests = scan(root, t.REQUESTS).filter(pl.col(c.ARRIVAL_NS) < newest).collect()
    steady = outside_incidents(requests, scan(root, t.INCIDENTS).collect())
    assert 0 < steady.height < requests.height  # the incident's requests are left out
    prepared = prepare(steady, scan(root, t.INSTANCE_GPUS).collect(),
                       scan(root, t.GPU_SAMPLES).collect(), scan(root, t.REQUEST_ENERGY).collect())
    return leaderboard(prepared, AnalyticsConfig())


def test_leaderboard_page_shows_the_analytics_leaderboard(app, demo_data) -> None:
    expected = _steady_board(demo_data[0])
    open_page(app, "leaderboard")
    (shown,) = frames(app)
    keys = [c.MODEL, c.GPU_MODEL, c.CONFIG]
    assert shown.select(keys).rows() == expected.select(keys).rows()
    for col in (c.RANK, c.RANK_LO, c.RANK_HI, c.REQUESTS, c.PARETO):
        assert shown[col].to_list() == expected[col].to_list(), col
    for col in (c.percentile_column("ttft", "p99"), c.percentile_column("e2e", "p99"),
                c.TOK_S_PER_GPU, c.J_PER_TOKEN, c.WEIGHTED_SCORE):
        assert shown[col].to_list() == pytest.approx(expected[col].to_list(), rel=1e-9), col


def test_host_p99_is_the_p99_of_the_hosts_requests(app, demo_data) -> None:
    """Not a request-weighted mean of the host's window p99s."""
    requests = scan(demo_data[0], t.REQUESTS).collect()
    truth = dict(requests.group_by(c.HOST_NAME).agg(
        pl.col(c.E2E_S).quantile(0.99, "linear")).iter_rows())
    _, hosts = frames(app)
    shown = dict(hosts.select(c.HOST_NAME, c.percentile_column("e2e", "p99")).iter_rows())
    assert shown.keys() == truth.keys()
    for host, p99 in truth.items():
        assert shown[host] == pytest.approx(p99, rel=1e-3), host  # the table rounds to 4 digits


def test_headline_p99_is_the_p99_of_the_recent_requests(app, demo_data) -> None:
    """The overview's latency headline: the p99 of the last five complete windows' requests."""
    windows = scan(demo_data[0], t.WINDOWS).select(c.WINDOW_START_NS).unique().collect()
    starts = sorted(windows[c.WINDOW_START_NS].to_list())
    recent = scan(demo_data[0], t.REQUESTS).filter(
        pl.col(c.ARRIVAL_NS).is_between(starts[-6], starts[-1], closed="left")).collect()
    # One tile per service and model (issue 32: no p99 pooled over two models), in order.
    p99s = recent.group_by(c.SERVICE_NAME, c.MODEL).agg(
        pl.col(c.TTFT_S).quantile(0.99, "linear")).sort(c.SERVICE_NAME, c.MODEL)[c.TTFT_S]
    tiles = [m.value for m in app.metric if m.label == "TTFT p99"]
    assert len(tiles) == len(p99s) > 1
    for shown, p99 in zip(tiles, p99s, strict=True):
        number, unit = shown.split()
        assert float(number.replace(",", "")) * (1e-3 if unit == "ms" else 1.0) == \
            pytest.approx(p99, rel=0.01)


def test_incident_phases_and_dimensions_are_the_stored_rows(app, demo_data) -> None:
    """The page renders analytics' `incident_phases`/`incident_dimensions` rows; it splits
    no baseline slice of its own (issue 32)."""
    from fleetlens.analytics.units import signed_duration

    root = demo_data[0]
    incident_id = scan(root, t.INCIDENTS).collect()[c.INCIDENT_ID][0]
    mine = pl.col(c.INCIDENT_ID) == incident_id
    stored = scan(root, t.INCIDENT_PHASES).filter(mine).collect()
    found = scan(root, t.INCIDENT_DIMENSIONS).filter(mine).sort(c.RANK).collect()
    assert stored.height == 4 and found.height, "analytics split the injected incident"
    open_page(app, "incident_detail", id=incident_id)
    _, phases, dims, _ = frames(app)
    assert phases[c.PHASE].to_list() == stored[c.PHASE].to_list()
    assert phases["excess"].to_list() == [signed_duration(x) for x in stored[c.EXCESS_S]]
    assert phases[c.SHARE].to_list() == stored[c.SHARE].to_list()
    assert dims.select(c.DIMENSION, c.DIMENSION_VALUE).rows() == found.select(
        c.DIMENSION, c.DIMENSION_VALUE).rows()
    assert dims[c.LIFT].to_list() == pytest.approx(found[c.LIFT].to_list())


def test_a_phase_that_got_faster_does_not_dwarf_the_excess() -> None:
    from fleetlens.dashboard.charts import phase_excess_chart

    phases = pl.DataFrame({"phase": ["queue", "prefill", "decode", "overhead"],
                           "excess_ms": [-1.2, 6.0, -177.0, 0.0], "share": [0.0, 1.0, 0.0, 0.0]})
    fig = phase_excess_chart(phases)
    lo, hi = fig.layout.yaxis.range
    assert hi > 6.0 and -0.5 * hi < lo < 0  # scaled to the +6 ms that explains the spike
    assert "-177 ms" in fig.data[0].text[2]  # the faster phase still says by how much


def test_kv_page_shows_analytics_kv_summary(app, demo_data) -> None:
    """Headroom is analytics' 1 - p95 of usage, not 1 - the peak."""
    from fleetlens.analytics.kvcache import kv_summary

    root = demo_data[0]
    gpus = scan(root, t.GPU_SAMPLES).group_by(c.HOST_NAME).agg(pl.col(c.GPU_MODEL).first())
    expected = kv_summary(scan(root, t.ENGINE_SAMPLES).collect(),
                          scan(root, t.INSTANCE_GPUS).collect(),
                          dict(gpus.collect().iter_rows()), AnalyticsConfig())
    open_page(app, "kv_cache")
    shown = frames(app)[-1].sort(c.INSTANCE_ID)
    expected = expected.sort(c.INSTANCE_ID)
    assert shown[c.INSTANCE_ID].to_list() == expected[c.INSTANCE_ID].to_list()
    for col in (c.KV_HEADROOM, "kv_usage_p95", c.PREEMPTIONS, c.PREFIX_HIT_RATE):
        assert shown[col].to_list() == pytest.approx(expected[col].to_list()), col


def _close_configs(n: int = 40) -> pl.DataFrame:
    """Requests of three configurations with overlapping latencies: uncertain ranks."""
    import numpy as np

    rng = np.random.default_rng(3)
    rows = []
    for i, gpu in enumerate(("A100", "H100", "L40S")):
        for k in range(n):
            ttft = float(rng.lognormal(-2 + 0.05 * i, 0.6))
            rows.append({c.REQUEST_ID: f"{gpu}-{k}", c.TRACE_ID: f"{i:016x}{k:016x}",
                         c.SPAN_ID: f"{k:016x}", c.MODEL: "m", c.GPU_MODEL: gpu,
                         c.HOST_NAME: f"h{i}", c.INSTANCE_ID: f"h{i}/m/0",
                         c.ARRIVAL_NS: k * 10**9, c.END_NS: k * 10**9 + 2 * 10**9,
                         c.TTFT_S: ttft, c.TPOT_S: float(rng.lognormal(-4, 0.3)),
                         c.E2E_S: ttft + 1.0, c.INPUT_TOKENS: 100, c.OUTPUT_TOKENS: 50,
                         c.CACHED_TOKENS: 0})
    return pl.DataFrame(rows)


def test_leaderboard_intervals_do_not_depend_on_row_order() -> None:
    """The page reads requests through DuckDB, the CLI through Polars: other row orders."""
    empty = pl.DataFrame(schema={c.INSTANCE_ID: pl.String, c.GPU_UUID: pl.String})
    gpus = pl.DataFrame(schema={c.HOST_NAME: pl.String, c.GPU_MODEL: pl.String})
    prepared = prepare(_close_configs(), empty, gpus)
    config = AnalyticsConfig(bootstrap_samples=50)
    boards = [leaderboard(prepared.sample(fraction=1.0, shuffle=True, seed=seed), config)
              for seed in range(6)]
    assert (boards[0][c.RANK_HI] > boards[0][c.RANK_LO]).any()  # the ranks are uncertain
    for board in boards[1:]:
        assert board.select(c.RANK, c.RANK_LO, c.RANK_HI).equals(
            boards[0].select(c.RANK, c.RANK_LO, c.RANK_HI))


def test_baselines_leave_out_the_filling_window_and_count_incidents_apart(app, demo_data
                                                                          ) -> None:
    from fleetlens.dashboard import queries
    from fleetlens.dashboard.filters import Filters
    from fleetlens.pipeline.storage import connect

    root, fleet = demo_data
    con = connect(root)
    series = queries.baseline_series(con, Filters())
    name = next(s for s in series[c.SERIES] if "gpu-host-01" in s and "ttft_p99" in s)
    frame = queries.baseline_with_actual(con, Filters(), name, "rolling")
    newest = scan(root, t.WINDOWS).select(pl.col(c.WINDOW_START_NS).max()).collect().item()
    assert frame.filter(pl.col(c.TS_NS) == newest)["actual"].null_count() == 1
    _, start, end = fleet.incident
    during = frame.filter(pl.col("in_incident"))
    assert during.height and during[c.TS_NS].min() >= start - 60 * 10**9
    assert during[c.TS_NS].max() < end
    assert during["anomaly"].any()  # the spike leaves the band inside the incident


def test_baselines_of_series_analytics_builds_draw_their_values(demo_data, tmp_path) -> None:
    # A peer ratio or a host's slowest GPU clock is no `windows` column: the page drew
    # their bands with no values (and no breaches) until the stored values were read.
    import shutil

    from fleetlens.dashboard import queries
    from fleetlens.dashboard.filters import Filters
    from fleetlens.pipeline.storage import DataDir, connect

    root = DataDir(tmp_path / "data")
    shutil.copytree(demo_data[0].root, root.root)
    stored = scan(root, t.BASELINES).collect()
    one = stored.filter(pl.col(c.SERIES) == stored[c.SERIES].min())
    name = "gpu_clock_min_mhz{service_name=a,model=b,host_name=c}"
    clock = one.with_columns(
        pl.lit(name).alias(c.SERIES), pl.lit("gpu_clock_min_mhz").alias(c.METRIC),
        (1900.0 + pl.int_range(pl.len()).cast(pl.Float64)).alias(c.VALUE))
    partition = next(root.table_dir(t.BASELINES).rglob("*.parquet")).parent
    clock.write_parquet(partition / "part-clock.parquet")
    frame = queries.baseline_with_actual(connect(root), Filters(), name, one[c.METHOD][0])
    joined = frame.join(clock.select(c.TS_NS, c.VALUE), on=c.TS_NS).drop_nulls("actual")
    assert joined.height >= frame.height - 1 > 0  # all but the filling window
    assert (joined["actual"] - joined[c.VALUE]).abs().max() < 1e-9
    assert "in_incident" in frame.columns  # the page shades incidents by it


def test_phase_chart_has_no_empty_negative_half() -> None:
    from fleetlens.dashboard.charts import phase_excess_chart

    phases = pl.DataFrame({"phase": ["queue", "prefill", "decode", "overhead"],
                           "excess_ms": [127_000.0, 137.0, 4965.0, -0.01],
                           "share": [0.96, 0.001, 0.04, 0.0]})
    lo, hi = phase_excess_chart(phases).layout.yaxis.range
    assert -0.2 * hi < lo <= 0  # no room drawn for a negative excess that is not there


def test_leaderboard_chart_labels_are_not_clipped(app) -> None:
    import json

    open_page(app, "leaderboard")
    pareto = next(ch for ch in app.get("plotly_chart")
                  if "Pareto" in json.loads(ch.proto.spec)["layout"]["title"]["text"])
    spec = json.loads(pareto.proto.spec)
    trace = spec["data"][0]
    assert trace["cliponaxis"] is False  # labels may leave the plot area, not be cut
    assert all(len(label) <= 40 for label in trace["text"])  # short labels; full in hover
    lo, hi = spec["layout"]["xaxis"]["range"]
    assert lo < min(trace["x"]) and max(trace["x"]) < hi  # room around the points
