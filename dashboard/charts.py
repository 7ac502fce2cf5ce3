"""Charts of the incident detail page: the phase excess and the signal small multiples."""

from __future__ import annotations

import plotly.graph_objects as go
import polars as pl

from fleetlens.dashboard.ui import PHASE_COLOURS, xs, ys

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
    labels = [f"{v:+,.1f} ms · {share:.0%}" if v > 0 else f"{v:+,.1f} ms (faster)"
              for v, share in zip(excess, phases["share"].to_list(), strict=True)]
    colours = [PHASE_COLOURS.get(ph, "#999") if v > 0 else "#c7c7c7"
               for ph, v in zip(phases["phase"].to_list(), excess, strict=True)]
    fig = go.Figure(go.Bar(x=phases["phase"].to_list(), y=[max(v, floor) for v in excess],
                           marker={"color": colours}, text=labels, textposition="outside",
                           cliponaxis=False, customdata=excess,
                           hovertemplate="%{x}: %{customdata:+.1f} ms<extra></extra>"))
    span = (top - floor) or 1.0
    fig.update_layout(height=300, yaxis_title="excess ms per request (during − before)",
                      yaxis={"range": [floor - 0.15 * span, top + 0.2 * span]},
                      margin={"l": 10, "r": 10, "t": 30, "b": 10})
    return fig


def small_multiple(frame: pl.DataFrame, column: str, *, shade: tuple[int, int],
                   height: int = 230) -> go.Figure:
    """One signal over time, the incident shaded, with few unrotated time ticks."""
    fig = go.Figure(go.Scatter(x=xs(frame), y=ys(frame, column), mode="lines",
                               line={"color": "#222"}, name=column))
    fig.add_vrect(x0=shade[0] / 1e6, x1=shade[1] / 1e6, fillcolor="rgba(228,87,86,0.2)",
                  line_width=0)
    fig.update_layout(title=column, height=height, showlegend=False, xaxis=SMALL_TIME_AXIS,
                      margin={"l": 10, "r": 10, "t": 40, "b": 10})
    return fig


def throttle_chart(frame: pl.DataFrame, *, shade: tuple[int, int]) -> go.Figure:
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
                      xaxis={**SMALL_TIME_AXIS, "nticks": 10},
                      yaxis={"type": "category", "automargin": True},
                      margin={"l": 10, "r": 10, "t": 40, "b": 10})
    return fig
