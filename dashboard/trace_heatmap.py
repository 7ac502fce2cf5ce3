"""The Traces page's latency heatmap and selection: its URL state, its figure, a box drawn on
it as a :class:`~analytics.traces.compare.Selection`, and the Traces page link of each
difference. The grid and the comparison come from analytics (:mod:`analytics.traces.heatmap`,
:mod:`analytics.traces.compare`); this module only draws and links them.

``traces?hm=queue_s&hm_from=<ns>&hm_to=<ns>&hm_min=1.5&hm_max=4`` opens the page with that
selection (times: Unix ns or any form of the one time grammar; a band side left out is open).
"""

from __future__ import annotations

import bisect
import datetime as dt
import math
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any
from urllib.parse import urlencode

import plotly.graph_objects as go

from fleetlens.analytics.traces.compare import Selection
from fleetlens.analytics.traces.heatmap import METRICS, Heatmap
from fleetlens.analytics.traces.query import SearchError, TraceQuery
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema.timegrammar import parse_time

NS = 1_000_000_000
#: metric column -> the label the page shows
LABELS = {c.TTFT_S: "TTFT", c.TPOT_S: "TPOT", c.E2E_S: "e2e", c.QUEUE_S: "queue"}
#: URL parameters of the heatmap (the metric) and of its selection
PARAMS = ("hm", "hm_from", "hm_to", "hm_min", "hm_max")


def seed(state: MutableMapping[str, Any], params: Mapping[str, Sequence[str]]) -> None:
    """Put a link's metric (``hm_metric``) and selection (``hm_sel``: the parameters' text)
    into ``state``; keys the session already has win."""
    metric = next(iter(params.get("hm", [])), c.E2E_S)
    state.setdefault("hm_metric", metric if metric in METRICS else c.E2E_S)
    if "hm_sel" not in state:
        sel = {name: next(iter(params.get(name, [])), "") for name in PARAMS[1:]}
        state["hm_sel"] = sel if any(sel.values()) else None


def encode(state: Mapping[str, Any]) -> dict[str, str]:
    """The URL parameters of the metric (when not e2e) and the selection (when one)."""
    out = {"hm": state["hm_metric"]} if state.get("hm_metric", c.E2E_S) != c.E2E_S else {}
    out.update({k: v for k, v in (state.get("hm_sel") or {}).items() if v})
    return out


def write(query_params: Any, state: Mapping[str, Any]) -> None:  # noqa: ANN401 - st.query_params
    """Replace the heatmap's parameters of ``query_params`` with those of ``state``."""
    wanted = encode(state)
    if {k: query_params[k] for k in PARAMS if k in query_params} == wanted:
        return
    for key in PARAMS:
        if key in query_params and key not in wanted:
            del query_params[key]
    for key, value in wanted.items():
        query_params[key] = value


def selection_of(state: Mapping[str, Any], view: TraceQuery) -> Selection | None:
    """The selection in ``state`` for the view's time range (an open side: the view's).

    Raises:
        SearchError: a selection parameter that does not parse.
    """
    sel = state.get("hm_sel")
    if not sel:
        return None
    def when(name: str, default: int) -> int:
        try:
            return parse_time(sel[name]) if sel.get(name) else default
        except ValueError as exc:
            raise SearchError(f"{name}: {exc}") from None

    def seconds(name: str) -> float | None:
        if not sel.get(name):
            return None
        try:
            value = float(sel[name])
        except ValueError:
            raise SearchError(f"{name}: {sel[name]!r} is not a number") from None
        if not math.isfinite(value):
            raise SearchError(f"{name}: {sel[name]!r} is not a finite number")
        return value

    return Selection(state.get("hm_metric", c.E2E_S), when("hm_from", view.start_ns or 0),
                     when("hm_to", view.end_ns or 2**63 - 1), seconds("hm_min"),
                     seconds("hm_max"))


def _moment(value: Any) -> int:  # noqa: ANN401 - plotly gives a date string or ms
    if isinstance(value, int | float):
        return int(value * 1e6)  # plotly's date axes count milliseconds
    return parse_time(str(value).replace(" ", "T") + ("Z" if "Z" not in str(value) else ""))


def from_box(box: Mapping[str, Any], grid: Heatmap) -> dict[str, str]:
    """A box drawn on the heatmap, snapped outwards to its cell edges, as ``hm_sel`` (edges
    of whole minutes on the page's grid: a link's range carries them exactly). The y axis
    counts latency buckets (0 at the bottom edge), whose edges are log-spaced seconds."""
    x0, x1 = sorted(_moment(v) for v in box["x"])
    y0, y1 = sorted(float(v) for v in box["y"])
    times, lats = grid.time_edges_ns, grid.latency_edges
    start = max([e for e in times if e <= x0], default=times[0])
    end = min([e for e in times if e >= x1], default=times[-1])
    low = lats[min(max(math.floor(y0), 0), len(lats) - 1)]
    high = lats[min(max(math.ceil(y1), 0), len(lats) - 1)]
    return {"hm_from": str(start), "hm_to": str(end), "hm_min": repr(low) if low > 0 else "",
            "hm_max": repr(high) if high < lats[-1] else ""}


def _position(lats: list[float], seconds: float) -> float:
    """Where ``seconds`` is on the bucket-counting y axis (inside its bucket, log-linear)."""
    i = max(bisect.bisect_right(lats, seconds) - 1, 0)
    if i >= len(lats) - 1:
        return float(len(lats) - 1)
    lo, hi = lats[i], lats[i + 1]
    if lo <= 0:
        return i + (seconds / hi if hi else 0.0)
    return i + math.log(seconds / lo) / math.log(hi / lo)


def _utc(ns: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ns / NS, tz=dt.UTC).replace(tzinfo=None)


def figure(grid: Heatmap, selection: Selection | None) -> go.Figure:
    """The heatmap (count per cell, empty cells blank), an invisible point per cell centre
    (plotly selects points, not heatmap cells: the box needs something to select) and the
    selection's outline."""
    times = [_utc(e) for e in grid.time_edges_ns]
    lats = grid.latency_edges
    rows = list(range(len(lats)))  # bucket edges on the y axis; ticks say their seconds
    z = [[n or None for n in row] for row in grid.matrix()]
    fig = go.Figure(go.Heatmap(x=times, y=rows, z=z, colorscale="Viridis", hoverongaps=False,
                               colorbar={"title": "requests"}, customdata=[
                                   [f"{lats[i]:.4g}-{lats[i + 1]:.4g} s"] * len(z[0])
                                   for i in range(len(z))],
                               hovertemplate="%{x}<br>%{customdata}<br>%{z} requests"
                                             "<extra></extra>"))
    mid_t = [a + (b - a) / 2 for a, b in zip(times, times[1:], strict=False)]
    fig.add_trace(go.Scatter(x=[t for i in rows[:-1] for t in mid_t],
                             y=[i + 0.5 for i in rows[:-1] for _ in mid_t], mode="markers",
                             marker={"opacity": 0, "size": 4}, hoverinfo="skip",
                             showlegend=False))
    if selection is not None:
        fig.add_shape(type="rect", line={"color": "#e45756", "width": 2},
                      x0=_utc(max(selection.start_ns, grid.time_edges_ns[0])),
                      x1=_utc(min(selection.end_ns, grid.time_edges_ns[-1])),
                      y0=_position(lats, selection.low or 0.0),
                      y1=_position(lats, selection.high) if selection.high else rows[-1])
    ticks = rows[::5] if rows[-1] % 5 == 0 else [*rows[::5], rows[-1]]
    fig.update_layout(height=360, dragmode="select", xaxis_title="arrival (UTC)",
                      yaxis={"title": f"{LABELS[grid.metric]} (s, log buckets)",
                             "tickvals": ticks, "ticktext": [f"{lats[i]:.3g}" for i in ticks],
                             "range": [0, rows[-1]]},
                      margin={"l": 10, "r": 10, "t": 30, "b": 10})
    return fig


def link(query: TraceQuery) -> str:
    """The Traces page URL of a drill-down search (the sidebar's time range widened to whole
    minutes, its lists, and the page's own filters)."""
    params: dict[str, Any] = {"range": "custom"}
    if query.start_ns is not None:
        params["from"] = _utc(query.start_ns // (60 * NS) * 60 * NS).strftime("%Y-%m-%dT%H:%MZ")
    if query.end_ns is not None:
        up = -(-query.end_ns // (60 * NS)) * 60 * NS
        params["to"] = _utc(up).strftime("%Y-%m-%dT%H:%MZ")
    for field, name in (("services", "service"), ("models", "model"), ("hosts", "host"),
                        ("regions", "region"), ("instances", "instance"), ("gpus", "gpu"),
                        ("finish_reasons", "finish")):
        if getattr(query, field):
            params[name] = list(getattr(query, field))
    mins = [f"{b.column}={b.low!r}" for b in query.bounds if b.low is not None]
    maxs = [f"{b.column}={b.high!r}" for b in query.bounds if b.high is not None]
    params.update({k: v for k, v in (("min", mins), ("max", maxs),
                                     ("attr", [str(a) for a in query.attrs])) if v})
    if query.error is not None:
        params["errors"] = "only" if query.error else "none"
    params["sort"] = f"-{query.sort}"
    return "traces?" + urlencode(params, doseq=True)
