"""The Traces page's latency heatmap and selection (issue 35 item 2 in the dashboard): a
link's selection runs analytics' comparison and lists its differences, the first one the
injected incident's host, each linked to exactly its selected requests; a box drawn on the
chart snaps to the grid's cells and becomes the selection in the URL."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import polars as pl
import pytest

from fleetlens.analytics.traces.heatmap import heatmap
from fleetlens.dashboard import trace_heatmap
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import scan
from tests.dashboard.test_traces_page import open_traces, table

NS = 10**9


def differences(at) -> pl.DataFrame:  # noqa: ANN001
    return pl.from_pandas(next(d for d in at.dataframe if "difference" in d.value.columns)
                          .value)


@pytest.fixture
def fresh_app(demo_data, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from tests.dashboard.conftest import APP

    def make() -> AppTest:
        monkeypatch.setenv("FLEETLENS_DATA", str(demo_data[0].root))
        monkeypatch.delenv("FLEETLENS_CONFIG", raising=False)
        return AppTest.from_file(str(APP), default_timeout=60)
    return make


def test_a_linked_selection_names_the_incident_host_and_links_to_its_requests(
        fresh_app, demo_data) -> None:
    root, fleet = demo_data
    host, start, end = fleet.incident
    at = open_traces(fresh_app(), range="all", hm=c.QUEUE_S, hm_from=str(start),
                     hm_to=str(end), hm_min="0.4")
    assert not at.error, [e.value for e in at.error]
    assert at.selectbox(key="hm_metric").value == c.QUEUE_S
    assert len(at.get("plotly_chart")) == 2  # the heatmap, the page's phase split
    found = differences(at)
    assert found["difference"][0] == f"{c.HOST_NAME}={host}"
    assert found["selected"][0] == 1.0 and found["lift"][0] > 3
    requests = scan(root, t.REQUESTS).collect()
    selected = requests.filter(pl.col(c.ARRIVAL_NS).is_between(start, end, closed="left")
                               & (pl.col(c.QUEUE_S) >= 0.4))
    assert set(selected[c.HOST_NAME]) == {host}
    caption = " ".join(cap.value for cap in at.caption)
    assert f"{selected.height:,} requests selected" in caption
    # The host's link opens the selected requests (range widened to whole minutes: no other
    # request of the host queued 0.4 s outside the incident).
    url = urlsplit(found["traces"][0])
    assert url.path == "traces"
    params = parse_qs(url.query)
    assert params["host"] == [host] and params["min"] == [f"{c.QUEUE_S}=0.4"]
    opened = open_traces(fresh_app(), **params)
    assert not opened.error, [e.value for e in opened.error]
    ids = selected.sort(c.QUEUE_S, descending=True)[c.REQUEST_ID].head(50).to_list()
    assert table(opened)[c.REQUEST_ID].to_list() == ids
    assert f"of {selected.height:,}" in " ".join(cap.value for cap in opened.caption)


def test_no_selection_shows_the_heatmap_and_how_to_select(app) -> None:
    at = open_traces(app, range="all")
    assert not at.error
    assert len(at.get("plotly_chart")) == 2
    assert any("Drag a box" in cap.value for cap in at.caption)
    assert not any("difference" in d.value.columns for d in at.dataframe)


def test_a_bad_selection_parameter_is_one_error_line(fresh_app) -> None:
    at = open_traces(fresh_app(), range="all", hm_min="fast")
    assert [e.value for e in at.error] == ["hm_min: 'fast' is not a number"]


def test_a_box_snaps_outwards_to_whole_cells(demo_data) -> None:
    requests = scan(demo_data[0], t.REQUESTS).collect()
    grid = heatmap(requests, c.E2E_S, min_width_s=60)
    assert all(e % (60 * NS) == 0 for e in grid.time_edges_ns)
    t0 = grid.time_edges_ns[3]
    # the y axis counts latency buckets (their edges are log-spaced seconds)
    box = {"x": [trace_heatmap._utc(t0 + 10 * NS).isoformat(sep=" "),
                 trace_heatmap._utc(t0 + 70 * NS).isoformat(sep=" ")], "y": [4.2, 2.5]}
    width = grid.time_edges_ns[1] - grid.time_edges_ns[0]
    assert trace_heatmap.from_box(box, grid) == {
        "hm_from": str(t0), "hm_to": str(t0 + width * (2 if width <= 60 * NS else 1)),
        "hm_min": repr(grid.latency_edges[2]), "hm_max": repr(grid.latency_edges[5])}


def test_the_selection_round_trips_through_the_url() -> None:
    link = {"hm": [c.TTFT_S], "hm_from": ["1790000000000000000"], "hm_max": ["2.5"]}
    state: dict = {}
    trace_heatmap.seed(state, link)
    assert trace_heatmap.encode(state) == {k: v[0] for k, v in link.items()}
    empty: dict = {}
    trace_heatmap.seed(empty, {})
    assert trace_heatmap.encode(empty) == {} and empty["hm_sel"] is None


def kv_selection(real_demo) -> tuple[str, int, int, float]:  # noqa: ANN001
    """The slow band of the demo's KV-pressure incident as analytics detected it: (latency
    column of its metric, its start and end (ns), the p99 of that column over the requests
    outside its window: slower than 99% of the rest is slow). Not its ``expected`` value: for
    a p50 incident that is the median, and half of every minute is above it."""
    import json

    from fleetlens.analytics.attribution.dimensions import metric_column

    truth = json.loads((real_demo.root / "ground-truth.json").read_text())["incidents"]
    kv = next(x for x in truth if x["cause"] == "kv_cache_pressure")
    assert kv["subject"] == f"{c.HOST_NAME}=h01"  # fleetlens/demo.toml
    found = (scan(real_demo, t.INCIDENTS).collect()
             .filter((pl.col(c.START_NS) < kv[c.END_NS]) & (pl.col(c.END_NS) > kv[c.START_NS])
                     & pl.col(c.HOST_NAME).is_in(["h01", "*"]))
             .sort(c.START_NS))
    assert found.height, "analytics found no incident in the KV-pressure window"
    inc = found.row(0, named=True)
    metric, start, end = metric_column(inc[c.METRIC]), int(inc[c.START_NS]), int(inc[c.END_NS])
    rest = scan(real_demo, t.REQUESTS).filter(
        ~pl.col(c.ARRIVAL_NS).is_between(start, end, closed="left")).select(metric).collect()
    return metric, start, end, float(rest[metric].quantile(0.99))


@pytest.mark.e2e
@pytest.mark.slow
def test_on_the_real_demo_the_kv_pressure_slow_band_names_h01_first(real_demo,
                                                                    monkeypatch) -> None:
    """Issue 35's check: the whole fleet's requests (both services) as the view, the
    detected KV-pressure incident's window and the requests above the rest's p99 as the
    selection: the CLI and the page both name host_name=h01 first (on the 2026-12-06 demo:
    ttft_s >= 0.256 s, 1,614 selected, lift 2.4, share of excess 1.0)."""
    import json

    from click.testing import CliRunner
    from streamlit.testing.v1 import AppTest

    from fleetlens.cli import cli
    from tests.dashboard.conftest import APP

    metric, start, end, low = kv_selection(real_demo)
    out = CliRunner().invoke(cli, [
        "traces", "compare", "--data-dir", str(real_demo.root), "--metric", metric,
        "--from", str(start), "--to", str(end), "--min-latency", repr(low),
        "--format", "json"])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.stdout)
    assert (rows[0]["dimension"], rows[0]["value"]) == (c.HOST_NAME, "h01"), rows[:3]
    assert rows[0]["lift"] > 2 and rows[0][c.SHARE_OF_EXCESS] > 0.9, rows[0]
    monkeypatch.setenv("FLEETLENS_DATA", str(real_demo.root))
    monkeypatch.delenv("FLEETLENS_CONFIG", raising=False)
    at = open_traces(AppTest.from_file(str(APP), default_timeout=120), range="all",
                     hm=metric, hm_from=str(start), hm_to=str(end), hm_min=repr(low))
    assert not at.error, [e.value for e in at.error]
    assert differences(at)["difference"][0] == f"{c.HOST_NAME}=h01"
