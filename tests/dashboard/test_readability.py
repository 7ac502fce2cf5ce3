"""Issue 32 §1, readability: units a person reads (s/ms, kJ/MJ), units in chart titles,
correlated charts on one time axis with the incident shaded, key columns first."""

from __future__ import annotations

import json
import re

from fleetlens.pipeline.schema import columns as c
from tests.dashboard.test_pages import INCIDENT, frames, open_page


def test_energy_reads_in_joule_multiples() -> None:
    from fleetlens.dashboard.ui import energy

    assert [energy(j) for j in (850, 12_400, 3.21e6, 45.6e6, 7.2e12)] == [
        "850 J", "12.4 kJ", "3.21 MJ", "45.6 MJ", "7,200 GJ"]


def test_energy_page_headline_and_power_limits(app) -> None:
    open_page(app, "energy")
    shown = next(m for m in app.metric if m.label == "Energy").value
    assert re.fullmatch(r"[\d,.]+ (kJ|MJ|GJ)", shown), shown
    power = frames(app)[0]
    assert power.columns[0] == "above limit"  # hosts over their limit come first


def test_incident_page_units_and_one_time_axis(app) -> None:
    open_page(app, "incident_detail", id=INCIDENT)
    _, phases, _, slowest = frames(app)
    for text in phases["excess"]:  # "+127.8 s", "-161 ms", never "+127772.0 ms"
        assert re.fullmatch(r"[+-][\d,]+(\.\d+)? (ms|s)", text), text
    assert slowest.columns[:3] == ["trace", c.E2E_S, c.HOST_NAME]
    charts = {ch.proto.id.rpartition("-")[2]: json.loads(ch.proto.spec)
              for ch in app.get("plotly_chart")}
    timed = {k: s for k, s in charts.items() if k.startswith("signal_") or k == "detail_metric"}
    assert len(timed) >= 5
    ranges = {tuple(s["layout"]["xaxis"]["range"]) for s in timed.values()}
    assert len(ranges) == 1  # one x-range for the metric and every correlated chart
    for key, spec in timed.items():
        assert spec["layout"].get("shapes"), key  # the incident shaded on each
        title = spec["layout"]["title"]["text"]
        if key != "signal_throttle":  # reason names, no quantity
            assert "(" in title or "per window" in title, title  # a unit in every title
