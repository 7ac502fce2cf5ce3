"""The availability page, failure incident pages and change markers, on synthetic data with
the failures analytics stores (:mod:`tests.dashboard.synth_failures`): what a user sees."""

from __future__ import annotations

import base64
import datetime as dt
import json

import numpy as np
import polars as pl

from fleetlens.pipeline.schema import columns as c
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
    (table,) = frames(at)
    assert table["what"].to_list() == ["Engine down", "Engine restarted", "Host down"]
    assert table["where"].to_list()[:1] == [sf.DOWN_ENGINE]
    assert table["for"].to_list()[0] == "5 min 0 s"
    assert table["open"].to_list()[0] == f"incident?id={sf.DOWN_ID}"
    assert any(s.value == "SLOs and error budget" for s in at.subheader)
    assert any("Not computed yet" in i.value for i in at.info)


def test_availability_follows_the_filters(app_failures) -> None:
    at = _all_data(app_failures)
    at.sidebar.multiselect(key="f_services").set_value([SERVICES[0]]).run()
    at = open_page(at, "availability")
    assert {m.label: m.value for m in at.metric}["Failure incidents"] == "0"
    assert any("no failure" in cap.value for cap in at.caption)


def test_availability_on_data_without_liveness_columns(app) -> None:
    at = open_page(_all_data(app), "availability")  # an older agent: no `up`, no start time
    assert {m.label: m.value for m in at.metric}["Engines"] == "8"
    assert not [tr for tr in _chart(at, "avail_timeline_0")["data"] if tr["name"] == "down"]


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
