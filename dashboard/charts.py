"""Chart builders: the incident detail page's phase excess and signal small multiples, the
availability timeline, and the change markers every time chart of the dashboard carries."""

from __future__ import annotations

import html

import numpy as np
import plotly.graph_objects as go
import polars as pl

from fleetlens.analytics.units import signed_duration
from fleetlens.dashboard.ui import LEGEND_ON_TOP, PHASE_COLOURS, TIME_AXIS, xs, ys
from fleetlens.pipeline.schema import Cause
from fleetlens.pipeline.schema import columns as c

#: NVML clocks-event-reason bits (nvmlClocksEventReason*), as the GPU samples carry them.
THROTTLE_REASONS = {0x01: "GPU idle", 0x04: "SW power cap", 0x08: "HW slowdown",
                    0x20: "SW thermal", 0x40: "HW thermal", 0x80: "HW power brake"}
#: Short time ticks, never rotated: a half-width chart has room for about four.
SMALL_TIME_AXIS = {"type": "date", "tickformat": "%H:%M", "nticks": 5, "tickangle": 0,
                   "title": {"text": "UTC", "standoff": 2}}
#: Negative excess (a phase that got faster) is drawn at most this far below zero, as a
#: fraction of the largest positive excess, so it cannot dwarf the phases that explain the
#: spike; its value is written on it.
NEGATIVE_ROOM = 0.3


def phase_excess_chart(phases: pl.DataFrame) -> go.Figure:
    """Excess ms per request by phase (``phase, excess_ms, share``), scaled to the positive
    excess: a phase that got faster shows as a short grey bar labelled with its value."""
    excess = phases["excess_ms"].to_list()
    top = max([v for v in excess if v > 0], default=0.0)
    lowest = min(excess + [0.0])
    floor = max(lowest, -NEGATIVE_ROOM * top) if top else lowest
    # As `fleetlens explain` prints them: "+127.8 s", not "+127772.0 ms".
    labels = [f"{signed_duration(v / 1000)} · {share:.0%}" if v > 0
              else f"{signed_duration(v / 1000)} (faster)"
              for v, share in zip(excess, phases["share"].to_list(), strict=True)]
    colours = [PHASE_COLOURS.get(ph, "#999") if v > 0 else "#c7c7c7"
               for ph, v in zip(phases["phase"].to_list(), excess, strict=True)]
    fig = go.Figure(go.Bar(x=phases["phase"].to_list(), y=[max(v, floor) for v in excess],
                           marker={"color": colours}, text=labels, textposition="outside",
                           cliponaxis=False, customdata=excess,
                           hovertemplate="%{x}: %{customdata:+,.1f} ms<extra></extra>"))
    span = (top - floor) or 1.0
    fig.update_layout(height=300, yaxis_title="excess ms per request (during − before)",
                      yaxis={"range": [floor - 0.15 * span, top + 0.2 * span]},
                      margin={"l": 10, "r": 10, "t": 30, "b": 10})
    return fig


#: Titles with units of the incident page's correlated signals.
SIGNAL_TITLES = {
    "arrivals_rps": "Arrivals (req/s)", "kv_usage_max": "KV cache usage, max (0-1)",
    c.PREEMPTIONS: "Preemptions per window", c.PREFIX_HIT_RATE: "Prefix hit rate (0-1)",
    c.SM_CLOCK_MHZ: "SM clock (MHz)", c.POWER_W: "GPU power (W)",
    c.POWER_LIMIT_W: "GPU power limit (W)", "temp_c_max": "GPU temperature, max (°C)",
}


def small_multiple(frame: pl.DataFrame, column: str, *, shade: tuple[int, int],
                   height: int = 230, x_range: tuple[int, int] | None = None) -> go.Figure:
    """One signal over time, the incident shaded, with few unrotated time ticks; charts
    given the same ``x_range`` (ns) line up, so a signal's move reads against the others."""
    fig = go.Figure(go.Scatter(x=xs(frame), y=ys(frame, column), mode="lines",
                               line={"color": "#222"}, name=column))
    fig.add_vrect(x0=shade[0] / 1e6, x1=shade[1] / 1e6, fillcolor="rgba(228,87,86,0.2)",
                  line_width=0)
    axis = {**SMALL_TIME_AXIS, **_x_range(x_range)}
    fig.update_layout(title=SIGNAL_TITLES.get(column, column), height=height,
                      showlegend=False, xaxis=axis,
                      margin={"l": 10, "r": 10, "t": 40, "b": 10})
    return fig


def _x_range(x_range: tuple[int, int] | None) -> dict:
    return {} if x_range is None else {"range": [x_range[0] / 1e6, x_range[1] / 1e6]}


def throttle_chart(frame: pl.DataFrame, *, shade: tuple[int, int],
                   x_range: tuple[int, int] | None = None) -> go.Figure:
    """The throttle-reason bitmask decoded: one row per reason, a mark where it was set."""
    fig = go.Figure()
    masks = frame["throttle_reasons"].cast(pl.Int64).to_list()
    times = xs(frame)
    for bit, name in THROTTLE_REASONS.items():
        when = [x for x, m in zip(times, masks, strict=True) if m is not None and m & bit]
        if when:
            fig.add_trace(go.Scatter(x=when, y=[name] * len(when), mode="markers",
                                     marker={"symbol": "square", "size": 9}, name=name))
    fig.add_vrect(x0=shade[0] / 1e6, x1=shade[1] / 1e6, fillcolor="rgba(228,87,86,0.2)",
                  line_width=0)
    rows = max(len(fig.data), 1)
    fig.update_layout(title="GPU throttle reasons (windows with the reason set)",
                      height=120 + 28 * rows, showlegend=False,
                      xaxis={**SMALL_TIME_AXIS, "nticks": 10, **_x_range(x_range)},
                      yaxis={"type": "category", "automargin": True},
                      margin={"l": 10, "r": 10, "t": 40, "b": 10})
    return fig


#: How each failure or change is drawn: (short label, colour). A failure with a duration is
#: a band, an instant change (a restart, a configuration change) a dashed line.
MARKER_STYLE = {
    Cause.ENGINE_DOWN: ("down", "#d62728"), Cause.ENGINE_HANG: ("hang", "#d62728"),
    Cause.HOST_DOWN: ("host down", "#8c1c13"), Cause.GPU_FAULT: ("GPU fault", "#d62728"),
    Cause.REQUEST_ERRORS: ("errors", "#f58518"), Cause.TELEMETRY_GAP: ("no telemetry", "#7f7f7f"),
    Cause.ENGINE_RESTART: ("restart", "#6a3d9a"), Cause.CONFIG_CHANGE: ("config", "#6a3d9a"),
}
INSTANT = frozenset({Cause.ENGINE_RESTART, Cause.CONFIG_CHANGE})
#: More markers than this on one chart are noise: the earliest are kept, and the caption of
#: the availability page lists them all.
MAX_MARKERS = 40
#: Labels closer than this share of the time axis are stacked (a crash and its restart).
LABEL_ROOM = 0.06
TIMELINE_COLOURS = {"up": "#54a24b", "down": "#e45756", "no data": "#bab0ac"}


def _x_extent(fig: go.Figure) -> tuple[float, float] | None:
    """The range of the figure's x values (epoch ms), or ``None`` without data."""
    values = []
    for trace in fig.data:
        if getattr(trace, "orientation", None) == "h":  # bars from base to base + length
            if trace.base is not None and trace.x is not None:
                base = np.asarray(trace.base, np.float64)
                values += [base, base + np.asarray(trace.x, np.float64)]
        elif trace.x is not None and len(trace.x) and np.asarray(trace.x).dtype.kind in "fiu":
            values.append(np.asarray(trace.x, dtype=np.float64))
    if not values:
        return None
    joined = np.concatenate(values)
    joined = joined[np.isfinite(joined)]
    return (float(joined.min()), float(joined.max())) if joined.size else None


def add_markers(fig: go.Figure, markers: pl.DataFrame | None) -> go.Figure:
    """Draw failures (bands) and restarts or configuration changes (dashed lines) on a time
    chart, each with a short label inside the plot's top edge whose hover names the cause,
    the subject and analytics' summary.

    Args:
        fig: a chart whose x axis is epoch milliseconds (as :func:`ui.xs` gives them).
        markers: rows of :func:`dashboard.failures.failure_incidents` (``cause, subject,
            summary, start_ns, end_ns``); ``None`` or empty draws nothing.

    Markers are clipped to the chart's data so they never stretch its time axis.
    """
    extent = _x_extent(fig)
    if markers is None or markers.is_empty() or extent is None:
        return fig
    lo, hi = extent
    placed: list[float] = []  # label positions so far: close ones are stacked, not overlaid
    for row in markers.head(MAX_MARKERS).iter_rows(named=True):
        cause = str(row[c.CAUSE] or "")
        label, colour = MARKER_STYLE.get(cause, (cause or "failure", "#d62728"))
        start = row[c.START_NS] / 1e6
        end = (row[c.END_NS] or row[c.START_NS]) / 1e6
        if end < lo or start > hi:
            continue
        hover = "<br>".join(html.escape(str(part)) for part in (
            f"{cause} on {row[c.SUBJECT]}", row[c.SUMMARY]) if part)
        near = sum(1 for x in placed if abs(x - max(start, lo)) < LABEL_ROOM * (hi - lo))
        placed.append(max(start, lo))
        note = {"text": label, "hovertext": hover, "font": {"size": 10, "color": colour},
                "yanchor": "top", "yshift": -11 * near}  # inside the plot: the legend is above
        if cause in INSTANT:
            fig.add_vline(x=max(start, lo), line={"color": colour, "dash": "dash", "width": 1},
                          annotation=note, annotation_position="top")
        else:
            fig.add_vrect(x0=max(start, lo), x1=min(max(end, start), hi), fillcolor=colour,
                          opacity=0.15, line_width=0, layer="below", annotation=note,
                          annotation_position="top left")
    return fig


def availability_timeline(segments: pl.DataFrame, restarts: pl.DataFrame, title: str
                          ) -> go.Figure:
    """Each engine's up / down / no-data runs as horizontal bars on a time axis, one row per
    engine, and a diamond where a new process started (a restart)."""
    fig = go.Figure()
    engines = sorted(segments[c.INSTANCE_ID].unique().to_list())
    for state, colour in TIMELINE_COLOURS.items():
        part = segments.filter(pl.col("state") == state)
        if part.is_empty():
            continue
        start = part[c.START_NS].to_numpy() / 1e6
        length = part[c.END_NS].to_numpy() / 1e6 - start
        text = [f"{i}: {state} for {ln / 1000:,.0f} s" for i, ln in
                zip(part[c.INSTANCE_ID].to_list(), length, strict=True)]
        fig.add_trace(go.Bar(y=part[c.INSTANCE_ID].to_list(), x=length, base=start,
                             orientation="h", name=state, marker={"color": colour},
                             hovertext=text, hoverinfo="text"))
    if restarts.height:
        fig.add_trace(go.Scatter(
            x=restarts[c.START_NS].to_numpy() / 1e6, y=restarts[c.INSTANCE_ID].to_list(),
            mode="markers", name="restart", hoverinfo="text",
            hovertext=[f"{i}: new process" for i in restarts[c.INSTANCE_ID].to_list()],
            marker={"symbol": "diamond", "size": 10, "color": "#6a3d9a",
                    "line": {"color": "white", "width": 1}}))
    fig.update_layout(title=title, barmode="overlay", height=135 + 30 * max(len(engines), 1),
                      legend=LEGEND_ON_TOP, xaxis=TIME_AXIS, bargap=0.35,
                      # Headroom above the top engine for the markers' labels.
                      yaxis={"type": "category", "categoryorder": "array",
                             "categoryarray": engines[::-1], "automargin": True,
                             "range": [-0.5, len(engines) - 0.5 + 0.9]},
                      margin={"l": 10, "r": 10, "t": 50, "b": 10})
    return fig
