"""Shared rendering: the sidebar (time range, filters, auto-refresh) and chart builders."""

from __future__ import annotations

import datetime as dt
import time

import numpy as np
import plotly.graph_objects as go
import polars as pl
import streamlit as st

from fleetlens.analytics.units import duration, versus  # noqa: F401 - the pages use them as ui.*
from fleetlens.dashboard import data, url_state
from fleetlens.dashboard.filters import Filters
from fleetlens.pipeline.schema import columns as c

NS = 1_000_000_000
RANGES = {"Last 15 min": 900, "Last 1 h": 3600, "Last 6 h": 6 * 3600, "Last 24 h": 86400,
          "Last 7 d": 7 * 86400, "All data": None}
FILTER_KEYS = {"services": c.SERVICE_NAME, "models": c.MODEL, "hosts": c.HOST_NAME,
               "regions": c.REGION}
#: "Last 24 h": what on-call looks at first, and a bounded number of points per chart.
DEFAULT_RANGE = list(RANGES).index("Last 24 h")
#: Legends above the plot, right-aligned: below it they covered the axis's date line.
LEGEND_ON_TOP = {"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 1, "xanchor": "right"}
#: Every time axis is UTC, and says so.
TIME_AXIS = {"type": "date", "title": {"text": "UTC", "standoff": 4}}
PHASE_COLOURS = {"queue": "#e45756", "prefill": "#f58518", "decode": "#4c78a8",
                 "overhead": "#bab0ac", "span": "#9ecae9"}


def energy(joules: float | None) -> str:
    """Energy in the unit that reads best: ``850 J``, ``12.4 kJ``, ``3.21 MJ``, ``1,050 GJ``."""
    if joules is None:
        return "n/a"
    unit, size = next(((u, n) for u, n in (("GJ", 1e9), ("MJ", 1e6), ("kJ", 1e3))
                       if abs(joules) >= n), ("J", 1.0))
    value = joules / size
    places = 2 if abs(value) < 10 else 1 if abs(value) < 100 else 0
    return f"{value:,.{places if unit != 'J' else 0}f} {unit}"


def to_datetime(ns: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ns / NS, tz=dt.UTC)


def readable(frame: pl.DataFrame) -> pl.DataFrame:
    """A table for people: int64-ns time columns as UTC datetimes (ms), floats to 4 digits."""
    return frame.with_columns(
        *[pl.from_epoch(pl.col(name), time_unit="ns").dt.cast_time_unit("ms")
          .dt.replace_time_zone("UTC")
          for name, dtype in frame.schema.items() if name.endswith("_ns") and dtype.is_integer()],
        pl.selectors.float().round_sig_figs(4),
    )


def with_time(frame: pl.DataFrame, column: str, alias: str = "time") -> pl.DataFrame:
    """Add a UTC datetime column from an int64-ns column."""
    return frame.with_columns(pl.from_epoch(pl.col(column), time_unit="ns").alias(alias))


def xs(frame: pl.DataFrame, column: str = "time") -> np.ndarray:
    """A datetime column as epoch milliseconds: plotly draws them on a date axis, and numeric
    arrays skip plotly's slow per-element validation and JSON encoding of datetimes."""
    return frame[column].dt.epoch("ms").to_numpy().astype(np.float64)


def ys(frame: pl.DataFrame, column: str) -> np.ndarray:
    """A numeric column as float64 (nulls become NaN, drawn as gaps)."""
    return frame[column].cast(pl.Float64).fill_null(float("nan")).to_numpy()


def narrowed(options: dict[str, list[str]], scope: list[tuple[str, str, str]],
             services: list[str], models: list[str]) -> dict[str, list[str]]:
    """The filter options once services (and models) are picked: only the models those
    services serve and the hosts serving them."""
    rows = [r for r in scope if (not services or r[0] in services)]
    out = dict(options)
    if services:
        out[c.MODEL] = [m for m in options.get(c.MODEL, []) if any(r[1] == m for r in rows)]
    rows = [r for r in rows if not models or r[1] in models]
    if services or models:
        out[c.HOST_NAME] = [h for h in options.get(c.HOST_NAME, [])
                            if any(r[2] == h for r in rows)]
    return out


def sidebar() -> Filters:
    """Render the time range picker, dimension filters and refresh controls; return filters.

    The picks live in the URL too (:mod:`dashboard.url_state`): a shared link opens the
    same range and scope.
    """
    lo, hi = data.load("extent")
    opts = data.load("options")
    state = st.session_state
    bounds = (to_datetime(lo), to_datetime(hi)) if lo is not None and hi is not None else None
    url_state.seed(state, {k: st.query_params.get_all(k) for k in st.query_params},
                   {name: opts.get(col, []) for name, col in FILTER_KEYS.items()}, bounds)
    state.setdefault("f_range", list(RANGES)[DEFAULT_RANGE])
    with st.sidebar:
        st.caption(f"Data: `{data.data_dir().root}`")
        choice = st.selectbox("Time range", [*RANGES, "Custom"], key="f_range",
                              help="Relative to the newest data.")
        start = end = None
        if bounds is not None:
            if choice == "Custom":
                state.setdefault("f_custom", bounds)
                picked = st.slider("From / to (UTC)", min_value=bounds[0], max_value=bounds[1],
                                   key="f_custom", format="MM-DD HH:mm",
                                   step=dt.timedelta(minutes=1))
                start, end = int(picked[0].timestamp() * NS), int(picked[1].timestamp() * NS)
            elif RANGES[choice] is not None:
                start, end = max(lo, hi - RANGES[choice] * NS), hi
        picks: dict[str, tuple[str, ...]] = {}
        for name, column in FILTER_KEYS.items():
            if name in ("models", "hosts"):
                opts = narrowed(opts, data.load("scope_hosts"), list(picks.get("services", ())),
                                list(picks.get("models", ())))
            values = opts.get(column, [])
            key = f"f_{name}"
            # A pick the narrowed list no longer offers would make the widget fail.
            if key in state:
                state[key] = [v for v in state[key] if v in values]
            picks[name] = tuple(st.multiselect(name.capitalize(), values, key=key,
                                               disabled=not values))
        _refresh_controls()
    url_state.write(st.query_params, state)
    return Filters(start, end, **picks)


def _refresh_controls() -> None:
    interval = data.config().auto_refresh_s
    cols = st.columns(2)
    if cols[0].button("Refresh", key="refresh", help="Read the data directory again now."):
        data.clear()
    if interval and cols[1].toggle("Auto", key="auto_refresh",
                                   help=f"Reload every {interval} s for live use."):
        st.session_state["_last_run"] = time.monotonic()

        @st.fragment(run_every=interval)
        def _tick() -> None:
            # The fragment also runs within each full run; only a timer tick reruns the app.
            if time.monotonic() - st.session_state.get("_last_run", 0) >= interval * 0.9:
                st.rerun()

        _tick()


def band_chart(frame: pl.DataFrame, value: str, title: str, *, band: pl.DataFrame | None = None,
               shade: tuple[int, int] | None = None, height: int = 260) -> go.Figure:
    """A time series with an optional baseline band (lower..upper, expected dashed)."""
    fig = go.Figure()
    if band is not None and band.height:
        bt = with_time(band, c.TS_NS)
        x = xs(bt)
        fig.add_trace(go.Scatter(x=x, y=ys(bt, c.UPPER), line={"width": 0}, mode="lines",
                                 showlegend=False, hoverinfo="skip"))
        fig.add_trace(go.Scatter(x=x, y=ys(bt, c.LOWER), fill="tonexty", mode="lines",
                                 fillcolor="rgba(76,120,168,0.18)", line={"width": 0},
                                 name="baseline band"))
        fig.add_trace(go.Scatter(x=x, y=ys(bt, c.EXPECTED), name="expected", mode="lines",
                                 line={"dash": "dot", "color": "#4c78a8"}))
    if frame.height:
        fig.add_trace(go.Scatter(x=xs(frame), y=ys(frame, value), name=title, mode="lines",
                                 line={"color": "#222"}))
    if shade is not None:
        fig.add_vrect(x0=shade[0] / 1e6, x1=shade[1] / 1e6,
                      fillcolor="rgba(228,87,86,0.2)", line_width=0)
    fig.update_layout(title=title, height=height, margin={"l": 10, "r": 10, "t": 40, "b": 10},
                      legend=LEGEND_ON_TOP, xaxis=TIME_AXIS)
    return fig


def lines(frame: pl.DataFrame, y: str, by: str, title: str, height: int = 280) -> go.Figure:
    """One line per value of ``by``."""
    fig = go.Figure()
    for (key,), part in frame.sort("time").group_by(by, maintain_order=True):
        fig.add_trace(go.Scatter(x=xs(part), y=ys(part, y), name=str(key), mode="lines"))
    # The legend sits above the plot: leave it a line per four entries, below the title
    # (eight instances' legend was drawn over the title).
    legend_rows = -(-len(fig.data) // 4)
    fig.update_layout(title={"text": title, "y": 1.0, "yanchor": "top", "pad": {"t": 8}},
                      height=height + 20 * legend_rows,
                      margin={"l": 10, "r": 10, "t": 36 + 22 * legend_rows, "b": 10},
                      legend={**LEGEND_ON_TOP, "x": 0, "xanchor": "left"}, xaxis=TIME_AXIS)
    return fig


def empty_note(what: str) -> None:
    st.info(f"No {what} in this range and scope yet.")
