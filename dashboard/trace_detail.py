"""The trace explorer's drawing of one trace (:class:`analytics.traces.detail.TraceDetail`):
its waterfall and its requests' instance signals (KV usage, batch and queue, SM clock, power)
as one figure on one time axis, milliseconds since the trace started, the request's lifetime
shaded in every signal row. Nothing is computed here but the layout."""

from __future__ import annotations

import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from fleetlens.analytics.traces.detail import TraceDetail
from fleetlens.dashboard import ui
from fleetlens.dashboard.explore import waterfall
from fleetlens.pipeline.schema import columns as c

#: Signal rows under the waterfall: (title, signals drawn in it).
ROWS = (("KV cache usage", (c.KV_CACHE_USAGE,)),
        ("batch (running) / queue (waiting)", (c.NUM_RUNNING, c.NUM_WAITING)),
        ("SM clock MHz", (c.SM_CLOCK_MHZ,)),
        ("power W", (c.POWER_W,)))
#: Milliseconds shown on either side of the trace, as a share of its length (at least 50 ms).
PAD = 0.05


def _short(series: str) -> str:
    # a GPU uuid is 40 characters: its first group tells a host's GPUs apart
    return series[:12] if series.startswith("GPU-") else series


def figure(detail: TraceDetail) -> go.Figure:
    """The waterfall (row 1) over the signal rows of :data:`ROWS`, x shared."""
    bars = waterfall(detail.spans, detail.requests)
    fig = make_subplots(rows=1 + len(ROWS), cols=1, shared_xaxes=True, vertical_spacing=0.04,
                        row_heights=[max(0.3, 0.08 * detail.spans.height)] + [0.17] * len(ROWS),
                        subplot_titles=["spans"] + [title for title, _ in ROWS])
    for kind, part in bars.group_by("kind", maintain_order=True):
        name = kind[0]
        fig.add_trace(go.Bar(y=part["label"].to_list(), x=part["duration_ms"].to_list(),
                             base=part["start_ms"].to_list(), orientation="h", name=name,
                             marker={"color": ui.PHASE_COLOURS.get(name, "#999")},
                             width=0.8 if name == "span" else 0.4), row=1, col=1)
    for i, (_, names) in enumerate(ROWS, start=2):
        for (signal, series), part in (detail.signals.filter(pl.col("signal").is_in(names))
                                       .group_by("signal", "series", maintain_order=True)):
            fig.add_trace(go.Scatter(x=part["offset_ms"].to_numpy(), y=part["value"].to_numpy(),
                                     mode="lines+markers", line={"shape": "hv"},
                                     name=f"{signal} {_short(str(series))}"), row=i, col=1)
    for r in detail.requests.iter_rows(named=True):
        lo = r["offset_ms"]
        hi = lo + (r[c.END_NS] - r[c.ARRIVAL_NS]) / 1e6
        for i in range(2, 2 + len(ROWS)):
            fig.add_vrect(x0=lo, x1=hi, fillcolor=ui.PHASE_COLOURS["span"], opacity=0.25,
                          line_width=0, row=i, col=1)  # type: ignore[arg-type]
    end = (detail.spans["offset_ms"] + detail.spans["duration_ms"]).max()
    pad = max(50.0, PAD * float(end or 0))  # type: ignore[arg-type]
    fig.update_xaxes(range=[-pad, float(end or 0) + pad])  # type: ignore[arg-type]
    fig.update_xaxes(title_text="ms since trace start", row=1 + len(ROWS), col=1)
    fig.update_yaxes(autorange="reversed", row=1, col=1)
    fig.update_layout(barmode="overlay", height=320 + 30 * detail.spans.height + 120 * len(ROWS),
                      title=f"Trace {detail.trace_id}", hovermode="x",
                      margin={"l": 10, "r": 10, "t": 60, "b": 10})
    return fig


def times(frame: pl.DataFrame) -> pl.DataFrame:
    """Int64-ns columns as UTC text to the millisecond (``start_ns`` becomes ``start UTC``:
    text, so every renderer shows the milliseconds); other values as they are (ms offsets
    keep their digits, where :func:`ui.readable` would round them to four)."""
    return frame.with_columns(
        pl.from_epoch(pl.col(name), time_unit="ns").dt.strftime("%Y-%m-%d %H:%M:%S%.3f")
        .alias(name) for name, dtype in frame.schema.items()
        if name.endswith("_ns") and dtype.is_integer()).rename(
        lambda name: f"{name.removesuffix('_ns')} UTC" if name.endswith("_ns") else name)


def time_columns(frame: pl.DataFrame) -> dict[str, object]:
    """Column settings that show ``frame``'s ms offsets and durations to the microsecond."""
    import streamlit as st

    return {name: st.column_config.NumberColumn(name, format="%.3f")
            for name in frame.columns if name.endswith("_ms")}
