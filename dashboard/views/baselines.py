"""Baselines: any series with its band, and the windows that left it."""

import plotly.graph_objects as go
import polars as pl
import streamlit as st

from fleetlens.dashboard import charts, data, ui
from fleetlens.pipeline.schema import columns as c


def incident_spans(frame: pl.DataFrame) -> list[tuple[int, int]]:
    """Runs of consecutive incident windows as (start, end) ns."""
    step = int(frame[c.TS_NS].diff().min() or 60 * 10**9) if frame.height > 1 else 60 * 10**9
    runs: list[tuple[int, int]] = []
    for ts in frame.filter(pl.col("in_incident"))[c.TS_NS].to_list():
        if runs and ts - runs[-1][1] <= 0:
            runs[-1] = (runs[-1][0], ts + step)
        else:
            runs.append((ts, ts + step))
    return runs


f = st.session_state["filters"]
st.title("Baselines")
series = data.load("baseline_series", f)
if series.is_empty():
    ui.empty_note("baselines")
    st.stop()
cols = st.columns([1, 3, 1])
metric = cols[0].selectbox("Metric", sorted(series[c.METRIC].unique()), key="bl_metric")
choices = series.filter(pl.col(c.METRIC) == metric)
name = cols[1].selectbox("Series", choices[c.SERIES].unique(maintain_order=True).to_list(),
                         key="bl_series")
method = cols[2].selectbox("Method", sorted(
    choices.filter(pl.col(c.SERIES) == name)[c.METHOD].unique()), key="bl_method")
frame = ui.with_time(data.load("baseline_with_actual", f, name, method), c.TS_NS)
fig = ui.band_chart(frame.drop_nulls("actual"), "actual", f"{metric} ({method})",
                    band=frame, height=380)
# Incident windows are shaded and counted apart: the band is about the usual, and a known
# incident leaving it is no news.
anomalies = frame.filter(pl.col("anomaly") & ~pl.col("in_incident"))
known = frame.filter(pl.col("anomaly") & pl.col("in_incident"))
fig.add_trace(go.Scatter(x=ui.xs(anomalies), y=ui.ys(anomalies, "actual"),
                         mode="markers", name="outside band",
                         marker={"color": "#e45756", "size": 8}))
for start, end in incident_spans(frame):
    fig.add_vrect(x0=start / 1e6, x1=end / 1e6, fillcolor="rgba(228,87,86,0.12)",
                  line_width=0)
st.plotly_chart(charts.add_markers(fig, data.load("failure_incidents", f)), key="bl_chart")
observed = frame.filter(pl.col("actual").is_not_null())
cols = st.columns(2)
cols[0].metric("Windows outside the band", anomalies.height,
               f"of {observed.filter(~pl.col('in_incident')).height} outside incidents",
               delta_color="off")
cols[1].metric("During incidents (shaded)", known.height,
               f"of {observed.filter(pl.col('in_incident')).height} incident windows",
               delta_color="off")
st.caption("The newest window is left out while it fills.")
if anomalies.height:
    st.dataframe(anomalies.select("time", "actual", c.EXPECTED, c.LOWER, c.UPPER),
                 hide_index=True, key="bl_anomalies")
else:
    st.caption("No window left the band outside incidents.")
