"""The availability page, failure incident pages and change markers, on synthetic data with
the failures analytics stores (:mod:`tests.dashboard.synth_failures`): what a user sees."""

from __future__ import annotations

import base64
import datetime as dt
import json

import numpy as np
import polars as pl

from fleetlens.analytics.runner import read_table
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from tests.dashboard import synth_failures as sf
from tests.dashboard.synth import SERVICES, Fleet
from tests.dashboard.test_pages import frames, open_page


def _utc(ns: int) -> str:
    return dt.datetime.fromtimestamp(ns / 1e9, tz=dt.UTC).strftime("%H:%M:%S")


def _chart(at, key: str) -> dict:  # noqa: ANN001
    return json.loads(next(ch for ch in at.get("plotly_chart") if ch.proto.id and
                           key in ch.proto.id).proto.spec)


def _values(v: object) -> list:
    """A trace array from a chart's spec: plotly sends numpy arrays as typed base64."""
    if isinstance(v, dict) and "bdata" in v:
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"]).tolist()
    return list(v)


def _labels(spec: dict) -> list[str]:
    """The marker labels on a chart (annotations whose hover names a cause)."""
    return [a["text"] for a in spec["layout"].get("annotations", []) if a.get("hovertext")]


def _all_data(at):  # noqa: ANN001, ANN202
    at.sidebar.selectbox(key="f_range").set_value("All data").run()
    assert not at.exception
    return at


def test_availability_shows_the_down_engine_its_period_and_the_failures(app_failures) -> None:
    at = open_page(_all_data(app_failures), "availability")
    assert at.title[0].value == "Availability"
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Engines"] == "8" and metrics["Failure incidents"] == "3"
    assert metrics["Requests failed"].split(" of ")[0] != "0"
    # The down engine's row in its service's timeline: down exactly over the failed scrapes.
    timeline = _chart(at, "avail_timeline_1")
    assert SERVICES[1] in timeline["layout"]["title"]["text"]
    down = next(tr for tr in timeline["data"] if tr["name"] == "down")
    start, end = sf.down_period(Fleet())
    assert down["y"] == [sf.DOWN_ENGINE]
    assert _values(down["base"]) == [start / 1e6]
    assert _values(down["x"]) == [(end - start) / 1e6]
    assert "down for 300 s" in down["hovertext"][0]
    silent = next(tr for tr in timeline["data"] if tr["name"] == "no data")
    assert set(silent["y"]) == {f"{sf.SILENT_HOST}/vllm-0", f"{sf.SILENT_HOST}/vllm-1"}
    restart = next(tr for tr in timeline["data"] if tr["name"] == "restart")
    assert restart["y"] == [sf.DOWN_ENGINE]
    assert {"down", "restart", "host down"} <= set(_labels(timeline))
    # The error rate rose while the gateway answered for the down engine.
    errors = _chart(at, "avail_errors")
    assert "down" in _labels(errors)
    table = frames(at)[0]
    assert table["what"].to_list() == ["Engine down", "Engine restarted", "Host down"]
    assert table["where"].to_list()[:1] == [sf.DOWN_ENGINE]
    assert table["for"].to_list()[0] == "5 min 0 s"
    assert table["open"].to_list()[0] == f"incident?id={sf.DOWN_ID}"
    assert any(s.value == "SLOs and error budget" for s in at.subheader)


def test_availability_follows_the_filters(app_failures) -> None:
    at = _all_data(app_failures)
    at.sidebar.multiselect(key="f_services").set_value([SERVICES[0]]).run()
    at = open_page(at, "availability")
    assert {m.label: m.value for m in at.metric}["Failure incidents"] == "0"
    assert any("no failure" in cap.value for cap in at.caption)
    # SLOs are per service: the other service's budget and alerts are out of scope.
    assert _configure_hints(at) == [SERVICES[0]] and not at.warning
    assert len(frames(at)) == 0


def test_availability_on_data_without_liveness_columns(app) -> None:
    at = open_page(_all_data(app), "availability")  # an older agent: no `up`, no start time
    assert {m.label: m.value for m in at.metric}["Engines"] == "8"
    assert not [tr for tr in _chart(at, "avail_timeline_0")["data"] if tr["name"] == "down"]
    assert _configure_hints(at) == sorted(SERVICES)  # no `slo_*` table at all: no numbers


def _configure_hints(at) -> list[str]:  # noqa: ANN001
    """The services the SLO section says to configure an SLO for."""
    return sorted(md_unescape(i.value.split("**")[1]) for i in at.info
                  if i.value.startswith("No SLO configured for"))


def md_unescape(text: str) -> str:
    return text.replace("\\", "")


def test_slo_section_shows_budget_burn_rates_and_the_firing_page(app_failures,
                                                                  failure_data) -> None:
    root, fleet = failure_data
    stored = read_table(root, t.SLO_STATUS).sort(c.SLO)
    at = open_page(_all_data(app_failures), "availability")
    assert not at.exception
    # The service with SLOs: its table, budget left as stored (availability exhausted).
    _, status, burns = frames(at)
    assert status[c.SLO].to_list() == ["availability", "ttft_0.12s"]
    assert status["target"].to_list() == ["99.9% of requests succeed",
                                          "ttft <= 0.12 s for 90%"]
    left = stored[c.BUDGET_REMAINING].to_list()
    assert status["budget left"].to_list() == left and left[0] == 0.0 and 0.3 < left[1] < 1
    assert status["compliance"][0] == f"{stored[c.COMPLIANCE][0]:.3%}"
    exhausted = [m.value for m in at.markdown if "Error budget exhausted" in m.value]
    assert len(exhausted) == 1 and exhausted[0].startswith(":red[")
    assert "availability" in exhausted[0] and "30 days" in exhausted[0]
    # Burn rate per alert window, shortest first: the outage burns 5 min hardest.
    assert burns.columns == [c.SLO, "5m", "30m", "1h", "6h", "3d"]
    rates = read_table(root, t.SLO_BURN_RATES).filter(pl.col(c.SLO) == "availability")
    assert burns["5m"][0] == rates.filter(pl.col(c.WINDOW_S) == 300)[c.BURN_RATE][0] > 14.4
    # The firing alerts: both page rules as warnings, the ticket as a note, with since when.
    pages = [w.value for w in at.warning]
    assert len(pages) == 2 and all(p.startswith("**PAGE** · availability") for p in pages)
    alerts = read_table(root, t.SLO_ALERTS)
    fast = alerts.filter(pl.col(c.ALERT) == "page_1h_5m").row(0, named=True)
    since = dt.datetime.fromtimestamp(fast[c.SINCE_NS] / 1e9, tz=dt.UTC)
    assert any("over 5m (fires at 14.4×)" in p and f"since {since:%Y-%m-%d %H:%M} UTC" in p
               for p in pages)
    assert any(i.value.startswith("**TICKET** · availability") for i in at.info)
    # The service without SLOs: how to configure one, no numbers.
    assert _configure_hints(at) == [SERVICES[0]]
    hint = next(i.value for i in at.info if i.value.startswith("No SLO configured"))
    assert "[analytics.slos]" in hint and "docs/operations.md" in hint
    # The budget spent over the period ends at the stored consumption, the outage marked.
    spent = _chart(at, "slo_budget_1")
    line = next(tr for tr in spent["data"] if tr["name"] == "availability")
    assert _values(line["y"])[-1] == stored[c.BUDGET_CONSUMED][0]
    assert _values(line["x"])[-1] == stored[c.TS_NS][0] / 1e6 >= sf.down_period(fleet)[1] / 1e6
    assert "down" in _labels(spent)


def test_failure_incident_page_says_what_stopped_when_and_what_it_did(app_failures) -> None:
    at = open_page(app_failures, "incident_detail", id=sf.DOWN_ID)
    metrics = {m.label: m.value for m in at.metric}
    where = {m.label: m.delta for m in at.metric}["What stopped"]
    start, _ = sf.down_period(Fleet())
    assert metrics["What stopped"] == "Engine down" and where == sf.DOWN_ENGINE
    assert metrics["Started (UTC)"] == _utc(start)
    assert metrics["For"] == "5 min 0 s"
    assert "30 scrapes failed" in at.subheader[0].value
    evidence, effects = frames(at)
    shown = dict(zip(evidence["field"], evidence["value"], strict=True))
    assert shown["failed_scrapes"] == "30" and shown["down_s"] == "5 min 0 s"
    assert shown["ongoing"] == "no" and shown[c.INSTANCE_ID] == sf.DOWN_ENGINE
    assert "failure_incident_id" not in shown  # its own id is no evidence
    assert effects[c.INCIDENT_ID].to_list() == [sf.PEER_ID]
    assert effects["open"].to_list() == [f"incident?id={sf.PEER_ID}"]
    assert effects[c.CAUSE].to_list() == ["kv_cache_pressure"]  # what it set off there
    (link,) = at.get("page_link")
    assert f"on {sf.PEER_HOST}" in link.proto.label
    assert "down" in _labels(_chart(at, "failure_timeline"))
    assert not any(s.value == "Where the excess latency went" for s in at.subheader)


def test_host_down_page_shows_its_silence(app_failures) -> None:
    at = open_page(app_failures, "incident_detail", id=sf.HOST_DOWN_ID)
    metrics = {m.label: m.value for m in at.metric}
    where = {m.label: m.delta for m in at.metric}["What stopped"]
    assert metrics["What stopped"] == "Host down" and where == sf.SILENT_HOST
    assert metrics["For"] == "3 min 0 s"
    evidence, = frames(at)
    shown = dict(zip(evidence["field"], evidence["value"], strict=True))
    assert shown["requests_served_meanwhile"] == "0" and shown["silent_s"] == "3 min 0 s"
    assert any("No latency incident" in cap.value for cap in at.caption)
    timeline = _chart(at, "failure_timeline")
    assert any(tr["name"] == "no data" for tr in timeline["data"])


def test_latency_incident_links_back_to_the_failure_that_set_it_off(app_failures) -> None:
    at = open_page(app_failures, "incident_detail", id=sf.PEER_ID)
    links = [p for p in at.get("page_link") if "Set off by a failure" in p.proto.label]
    assert len(links) == 1 and "gpu-host-02/vllm-0 down" in links[0].proto.label
    causes = frames(at)[0]
    assert causes[c.CAUSE].to_list() == ["engine_down", "kv_cache_pressure"]
    assert "down" in _labels(_chart(at, "detail_metric"))  # the marker on its chart


def test_every_time_chart_carries_the_markers(app_failures) -> None:
    at = _all_data(app_failures)
    for page, keys in (("overview", ["chart_rps"]), ("kv_cache", ["kv_usage"]),
                       ("energy", ["energy_host"])):
        at = open_page(at, page)
        for key in keys:
            labels = _labels(_chart(at, key))
            assert {"down", "restart", "host down"} <= set(labels), (page, key, labels)


def test_markers_of_the_helper_clip_to_the_chart() -> None:
    import plotly.graph_objects as go

    from fleetlens.dashboard.charts import add_markers

    fig = go.Figure(go.Scatter(x=[1_000.0, 2_000.0], y=[1, 2]))
    rows = pl.DataFrame({c.CAUSE: ["engine_down", "engine_restart", "host_down"],
                         c.SUBJECT: ["instance_id=a", "instance_id=a", "host_name=h"],
                         c.SUMMARY: ["<b>down</b>", "restart", "far away"],
                         c.START_NS: [500 * 10**6, 1_500 * 10**6, 9_000 * 10**6],
                         c.END_NS: [1_200 * 10**6, 1_560 * 10**6, 9_500 * 10**6]})
    add_markers(fig, rows)
    shapes = fig.layout.shapes
    assert len(shapes) == 2  # the one outside the data is not drawn
    assert shapes[0].x0 == 1_000.0 and shapes[0].x1 == 1_200.0  # clipped to the data
    assert shapes[1].type == "line" and shapes[1].x0 == 1_500.0
    assert "&lt;b&gt;" in fig.layout.annotations[0].hovertext  # summaries are escaped
