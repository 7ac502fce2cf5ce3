"""Energy: J/token by model and host over time, power against limits, per-request energy."""

import polars as pl
import streamlit as st

from fleetlens.dashboard import charts, data, ui
from fleetlens.pipeline.schema import columns as c

ABOVE = "above limit"

f = st.session_state["filters"]
st.title("Energy")
by_model = data.load("energy_by", f, c.MODEL)
if by_model.is_empty():
    ui.empty_note("windows")
    st.stop()
by_model = ui.with_time(by_model, c.WINDOW_START_NS)
by_host = ui.with_time(data.load("energy_by", f, c.HOST_NAME), c.WINDOW_START_NS)
total_j = by_model[c.ENERGY_J].sum()
tokens = by_model[c.OUTPUT_TOKENS].sum()
cols = st.columns(3)
cols[0].metric("Energy", ui.energy(total_j), help=f"{total_j / 3.6e6:,.2f} kWh")
cols[1].metric("Output tokens", f"{int(tokens):,}")
cols[2].metric("Energy per token", f"{total_j / tokens:,.2f} J/tok" if tokens else "n/a")
left, right = st.columns(2)
markers = data.load("failure_incidents", f)
left.plotly_chart(charts.add_markers(ui.lines(by_model, c.J_PER_TOKEN, c.MODEL,
                                              "Energy per token by model (J/token)"), markers),
                  key="energy_model")
right.plotly_chart(charts.add_markers(ui.lines(by_host, c.POWER_W, c.HOST_NAME,
                                               "Power by host (W)"), markers),
                   key="energy_host")
st.subheader("Power against limit")
power = data.load("power_vs_limit", f)
if power.height:
    # A host whose peak draw went above its GPUs' summed limit comes first, in red.
    power = power.with_columns(
        (pl.col("peak_power_w") > pl.col(c.POWER_LIMIT_W)).alias(ABOVE)).sort(
        ABOVE, descending=True, maintain_order=True).select(ABOVE, pl.exclude(ABOVE))
    over = int(power[ABOVE].sum())
    st.caption(f"{over} host(s) above their power limit at their peak." if over else
               "No host went above its power limit.")
    st.dataframe(power.to_pandas().style.apply(
        lambda row: ["background-color: #f8d0d0" if row[ABOVE] else "" for _ in row], axis=1)
        .format({col: "{:,.0f} W" for col in ("mean_power_w", "peak_power_w",
                                             c.POWER_LIMIT_W)})
        .format({"idle_share": "{:.0%}"}), hide_index=True, key="energy_power")
else:
    st.dataframe(power, hide_index=True, key="energy_power")
st.subheader("Per-request energy by host")
st.caption("Every retained request of the hosts in scope (request_energy); coverage is the "
           "share of the GPUs' energy attributed to requests.")
st.dataframe(data.load("request_energy", f), hide_index=True, key="energy_requests")
