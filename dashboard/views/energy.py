"""Energy: J/token by model and host over time, power against limits, per-request energy."""

import streamlit as st

from fleetlens.dashboard import charts, data, ui
from fleetlens.pipeline.schema import columns as c

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
cols[0].metric("Energy", f"{total_j / 3.6e6:,.2f} kWh")
cols[1].metric("Output tokens", f"{int(tokens):,}")
cols[2].metric("J/token", f"{total_j / tokens:.2f}" if tokens else "n/a")
left, right = st.columns(2)
markers = data.load("failure_incidents", f)
left.plotly_chart(charts.add_markers(ui.lines(by_model, c.J_PER_TOKEN, c.MODEL,
                                              "J/token by model"), markers),
                  key="energy_model")
right.plotly_chart(charts.add_markers(ui.lines(by_host, c.POWER_W, c.HOST_NAME,
                                               "Power by host (W)"), markers),
                   key="energy_host")
st.subheader("Power against limit")
st.dataframe(data.load("power_vs_limit", f), hide_index=True, key="energy_power")
st.subheader("Per-request energy by host")
st.caption("Every retained request of the hosts in scope (request_energy); coverage is the "
           "share of the GPUs' energy attributed to requests.")
st.dataframe(data.load("request_energy", f), hide_index=True, key="energy_requests")
