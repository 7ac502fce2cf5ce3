"""The trace explorer shows one trace in full (issue 35 item 3): every span's attributes,
resource attributes, events and links; times to the millisecond; the request's energy; and
its instance's KV usage, batch, SM clock and power in the same figure as its spans, on one
time axis (ms since the trace started)."""

from __future__ import annotations

import base64
import json

import numpy as np
import polars as pl
import pytest

from fleetlens.dashboard import ui
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.storage import DataDir
from tests.analytics import traces_detail_data as k
from tests.dashboard.conftest import app_over


@pytest.fixture(scope="module")
def known(tmp_path_factory: pytest.TempPathFactory) -> DataDir:
    root = DataDir(tmp_path_factory.mktemp("trace-page") / "data")
    k.build(root)
    return root


@pytest.fixture
def page(known, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    at = app_over(known, monkeypatch)
    at.query_params["id"] = k.TRACE
    at.switch_page("views/trace.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    return at


def _frame(at, column: str) -> pl.DataFrame:  # noqa: ANN001
    """The first table with ``column`` (AppTest does not show a dataframe's key)."""
    return pl.from_pandas(next(d.value for d in at.dataframe if column in d.value.columns))


def test_spans_attributes_events_links_and_energy(page) -> None:
    spans = _frame(page, c.PARENT_SPAN_ID)
    first = spans.filter(pl.col(c.SPAN_ID) == k.GATEWAY).row(0, named=True)
    assert first["start UTC"] == "2026-09-21 14:13:20.123"  # to the ms
    engine = spans.filter(pl.col(c.SPAN_ID) == k.ENGINE).row(0, named=True)
    assert (engine["offset_ms"], engine["duration_ms"]) == (4.5, 2250.0)
    attrs = _frame(page, "source")
    assert {("resource", "region", "eu-west"), ("span", "tags", '["a", 3]'),
            ("span", "gen_ai.request.id", k.REQUEST)} <= set(
        attrs.select("source", "key", "value").iter_rows())
    assert _frame(page, "ts UTC")[c.NAME].to_list() == ["retry"]
    assert _frame(page, "linked_trace_id")["linked_trace_id"].to_list() == [k.LINKED]
    energy = next(m for m in page.metric if m.label == "Energy")
    assert energy.value == ui.energy(k.ENERGY_J)
    assert _frame(page, c.ENERGY_J)[c.ENERGY_J].to_list() == [k.ENERGY_J]


def test_signals_share_the_spans_time_axis(page) -> None:
    (chart,) = page.get("plotly_chart")
    spec = json.loads(chart.proto.spec)
    traces = {t.get("name"): t for t in spec["data"]}
    assert {"span", "queue", "prefill", "decode"} <= set(traces)
    kv = traces[f"{c.KV_CACHE_USAGE} {k.INSTANCE}"]
    assert _numbers(kv["x"]) == [0.0, 1000.0, 2000.0, 3000.0]  # ms since the trace start
    assert _numbers(kv["y"]) == pytest.approx([0.6, 0.61, 0.62, 0.63])
    assert _numbers(traces[f"{c.POWER_W} {k.MINE}"]["y"]) == [400.0, 410.0, 420.0, 430.0]
    assert f"{c.SM_CLOCK_MHZ} {k.MINE}" in traces and f"{c.NUM_RUNNING} {k.INSTANCE}" in traces
    assert not any(k.OTHER in str(name) for name in traces)  # the host's other GPU
    # one time axis: the bars' and every signal row's x axes move together
    layout = spec["layout"]
    axes = {traces[name].get("xaxis", "x") for name in traces}
    assert len(axes) == 5
    assert len({layout["xaxis" + a[1:]].get("matches", a) for a in axes}) == 1
    # the request's lifetime (4.5 ms to 2,254.5 ms) shaded in every signal row
    assert {(s["x0"], s["x1"]) for s in layout["shapes"]} == {(4.5, 2254.5)}
    assert len(layout["shapes"]) == 4


def _numbers(value: object) -> list[float]:
    """A plotly array as floats (numpy arrays travel as base64 ``bdata``)."""
    if isinstance(value, dict):
        raw = base64.b64decode(value["bdata"])
        return np.frombuffer(raw, dtype=np.dtype(value["dtype"])).astype(float).tolist()
    return [float(v) for v in value]  # type: ignore[union-attr]
