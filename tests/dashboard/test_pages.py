"""Every page renders on demo data without an exception, with its key elements; filters work."""

from __future__ import annotations

import datetime as dt

import polars as pl
import pytest

from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema.causes import Cause
from tests.dashboard.synth import SERVICES

INCIDENT = "5f3a9c0e1b2d4a67"


def open_page(at, page: str, **query: str):  # noqa: ANN001, ANN201
    for key, value in query.items():
        at.query_params[key] = value
    at.switch_page(f"views/{page}.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    return at


def frames(at) -> list[pl.DataFrame]:  # noqa: ANN001
    return [pl.from_pandas(df.value) for df in at.dataframe]


def test_overview_shows_headline_metrics_charts_and_incidents(app) -> None:
    assert app.title[0].value == "Fleet overview"
    labels = [m.label for m in app.metric]
    for label in ("Requests/s", "Output tokens/s", "Energy per token", "TTFT p99", "TPOT p50",
                  "E2E p99"):
        assert label in labels
    assert len(app.get("plotly_chart")) == 6
    incidents, hosts = frames(app)
    assert incidents[c.CAUSE].to_list() == [Cause.KV_CACHE_PRESSURE.value]
    assert hosts[c.HOST_NAME][0] == "gpu-host-01"  # the host with the incident ranks first
    rps = next(m for m in app.metric if m.label == "Requests/s")
    assert float(rps.value.split()[0]) > 0


def test_sidebar_filters_narrow_the_overview(app) -> None:
    before = float(next(m for m in app.metric if m.label == "Requests/s").value.split()[0])
    app.sidebar.multiselect(key="f_services").set_value([SERVICES[1]]).run()
    assert not app.exception
    after = float(next(m for m in app.metric if m.label == "Requests/s").value.split()[0])
    assert 0 < after < before
    incidents, hosts = frames(app)
    assert incidents.is_empty()  # the incident is on the other service
    assert set(hosts[c.HOST_NAME]) == {"gpu-host-02", "gpu-host-03"}


def test_region_filter_selects_hosts(app) -> None:
    app.sidebar.multiselect(key="f_regions").set_value(["us-east"]).run()
    _, hosts = frames(app)
    assert set(hosts[c.HOST_NAME]) == {"gpu-host-01", "gpu-host-03"}


def test_time_range_picker(app) -> None:
    app.sidebar.selectbox(key="f_range").set_value("Last 15 min").run()
    assert not app.exception
    incidents, _ = frames(app)
    assert incidents.is_empty()  # the incident ended well before the last 15 minutes
    app.sidebar.selectbox(key="f_range").set_value("Custom").run()
    custom = app.sidebar.slider(key="f_custom")
    low, high = custom.value  # the whole range at first
    custom.set_value((high - dt.timedelta(minutes=15), high)).run()
    assert not app.exception and frames(app)[0].is_empty()
    app.sidebar.slider(key="f_custom").set_value((low, high)).run()
    assert frames(app)[0][c.CAUSE].to_list() == [Cause.KV_CACHE_PRESSURE.value]  # whole range


def test_incidents_page_lists_and_filters(app) -> None:
    open_page(app, "incidents")
    (table,) = frames(app)
    assert table[c.INCIDENT_ID].to_list() == [INCIDENT]
    assert table[c.SEVERITY].to_list() == ["critical"]
    app.multiselect(key="inc_cause").set_value([Cause.KV_CACHE_PRESSURE.value]).run()
    assert frames(app)[0].height == 1
    app.multiselect(key="inc_severity").set_value(["critical"]).run()
    assert frames(app)[0].height == 1
    app.sidebar.multiselect(key="f_hosts").set_value(["gpu-host-00"]).run()
    assert not app.exception
    assert any("No incidents" in i.value for i in app.info)


def test_incident_detail_renders_every_section(app) -> None:
    open_page(app, "incident_detail", id=INCIDENT)
    assert app.selectbox(key="detail_pick").value == INCIDENT
    assert "KV cache" in app.subheader[0].value
    assert len(app.get("plotly_chart")) >= 6  # metric, phases, signals
    # How it was found, under the metric's chart (the synthetic incident is a band breach).
    assert any("Above the upper band for 3 windows" in cap.value for cap in app.caption)
    causes, phases, dims, slowest = frames(app)
    assert causes[c.CAUSE][0] == Cause.KV_CACHE_PRESSURE.value
    assert dims.height > 0 and slowest.height > 0
    top = phases.sort(c.SHARE, descending=True)[c.PHASE][0]
    assert top == "queue"  # the injected incident is a queueing spike
    assert app.get("download_button")


@pytest.mark.parametrize("page,title,charts", [
    ("baselines", "Baselines", 1), ("kv_cache", "KV cache", 4), ("energy", "Energy", 2),
    ("leaderboard", "Leaderboard", 2),
])
def test_resource_pages(app, page: str, title: str, charts: int) -> None:
    open_page(app, page)
    assert app.title[0].value == title
    assert len(app.get("plotly_chart")) == charts
    assert app.dataframe


def test_baselines_mark_anomalies(app) -> None:
    open_page(app, "baselines")
    app.selectbox(key="bl_metric").set_value("ttft_p99_s").run()
    options = app.selectbox(key="bl_series").options
    host = next(o for o in options if "gpu-host-01" in o)
    app.selectbox(key="bl_series").set_value(host).run()
    assert not app.exception
    known = next(m for m in app.metric if m.label == "During incidents (shaded)")
    assert int(known.value) > 0  # the injected incident leaves the band, counted apart


def test_trace_explorer_waterfall(app, demo_data) -> None:
    open_page(app, "trace")
    (slowest,) = frames(app)
    trace_id = slowest[c.TRACE_ID][0]
    app.text_input(key="trace_lookup").set_value(trace_id).run()
    assert not app.exception
    (chart,) = app.get("plotly_chart")
    assert {"span", "queue", "prefill", "decode"} <= set(chart.proto.spec and
                                                         _trace_names(chart.proto.spec))
    request_id = frames(app)[1][c.REQUEST_ID][0]
    app.text_input(key="trace_lookup").set_value(request_id).run()
    assert frames(app)[0][c.TRACE_ID][0] == trace_id
    app.text_input(key="trace_lookup").set_value("' or 1=1 --").run()
    assert any("No trace" in w.value for w in app.warning)


def _trace_names(spec: str) -> set[str]:
    import json

    return {trace.get("name") for trace in json.loads(spec)["data"]}


def test_sql_console_runs_and_rejects(app) -> None:
    open_page(app, "sql")
    app.button(key="sql_run").click().run()
    assert not app.exception and not app.error
    (result,) = frames(app)
    assert set(result[c.SERVICE_NAME]) == set(SERVICES)
    app.text_area(key="sql_query").set_value("DROP VIEW requests").run()
    assert app.error and "only SELECT" in app.error[0].value


@pytest.mark.parametrize(("page", "says"), [
    ("incidents", "No incidents"), ("incident_detail", "No incidents"),
    ("baselines", "No baselines"), ("kv_cache", "No engine samples"),
    ("energy", "No windows"), ("leaderboard", "No requests"), ("trace", "No requests")])
def test_pages_on_an_empty_data_dir_say_so(tmp_path, monkeypatch, page: str, says: str) -> None:
    from streamlit.testing.v1 import AppTest

    from tests.dashboard.conftest import APP

    monkeypatch.setenv("FLEETLENS_DATA", str(tmp_path / "nothing-yet"))
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.run()
    assert not at.exception and any("No windows" in i.value for i in at.info)
    open_page(at, page)
    assert any(says in i.value for i in at.info), [i.value for i in at.info]


def test_sql_console_on_an_empty_data_dir_answers_with_no_rows(tmp_path, monkeypatch) -> None:
    from streamlit.testing.v1 import AppTest

    from tests.dashboard.conftest import APP

    monkeypatch.setenv("FLEETLENS_DATA", str(tmp_path / "nothing-yet"))
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.run()
    open_page(at, "sql")
    at.button(key="sql_run").click().run()
    assert not at.exception and not at.error
    assert any("0 row(s)" in caption.value for caption in at.caption)


def test_data_arriving_while_the_dashboard_runs_is_picked_up(tmp_path, monkeypatch) -> None:
    from streamlit.testing.v1 import AppTest

    from fleetlens.pipeline.storage import DataDir
    from tests.dashboard.conftest import APP
    from tests.dashboard.synth import Fleet, build_all

    root = DataDir(tmp_path / "live")
    monkeypatch.setenv("FLEETLENS_DATA", str(root.root))
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.run()
    assert not at.metric
    build_all(root, Fleet(hosts=2, gpus_per_host=1, hours=1.0))
    at.run()  # new tables change the connection's cache key: no restart, no stale views
    assert not at.exception
    assert any(m.label == "Requests/s" for m in at.metric)
