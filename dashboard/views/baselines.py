"""Baselines: any series with its band, and the windows that left it."""

import plotly.graph_objects as go
import polars as pl
import streamlit as st

from fleetlens.dashboard import data, ui
from fleetlens.pipeline.schema import columns as c

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
anomalies = frame.filter(pl.col("anomaly"))
fig.add_trace(go.Scatter(x=ui.xs(anomalies), y=ui.ys(anomalies, "actual"),
                         mode="markers", name="outside band",
                         marker={"color": "#e45756", "size": 8}))
st.plotly_chart(fig, key="bl_chart")
st.metric("Windows outside the band", anomalies.height, f"of {frame.height}", delta_color="off")
st.dataframe(anomalies.select("time", "actual", c.EXPECTED, c.LOWER, c.UPPER), hide_index=True,
             key="bl_anomalies")
