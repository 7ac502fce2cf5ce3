"""Incidents: what went wrong, when, where, and the top cause."""

import polars as pl
import streamlit as st

from fleetlens.dashboard import data, ui
from fleetlens.pipeline.schema import columns as c

f = st.session_state["filters"]
st.title("Incidents")
incidents = data.load("incidents", f)
if incidents.is_empty():
    ui.empty_note("incidents")
    st.stop()

cols = st.columns(3)
severities = cols[0].multiselect("Severity", sorted(incidents[c.SEVERITY].drop_nulls().unique()),
                                 key="inc_severity")
causes = cols[1].multiselect("Top cause", sorted(incidents[c.CAUSE].drop_nulls().unique()),
                             key="inc_cause")
metrics = cols[2].multiselect("Metric", sorted(incidents[c.METRIC].drop_nulls().unique()),
                              key="inc_metric")
if severities:
    incidents = incidents.filter(pl.col(c.SEVERITY).is_in(severities))
if causes:
    incidents = incidents.filter(pl.col(c.CAUSE).is_in(causes))
if metrics:
    incidents = incidents.filter(pl.col(c.METRIC).is_in(metrics))

table = ui.with_time(incidents, c.START_NS, "started (UTC)").with_columns(
    ((pl.col(c.END_NS) - pl.col(c.START_NS)) / 6e10).round(1).alias("minutes"),
    pl.concat_str([c.SERVICE_NAME, c.MODEL, c.HOST_NAME], separator=" / ").alias("scope"),
    pl.format("incident?id={}", c.INCIDENT_ID).alias("open"),
)
st.caption(f"{table.height:,} incident(s)")
st.dataframe(
    # What happened first (the top cause and its summary), then where and how much.
    ui.readable(table.select("open", "started (UTC)", c.SEVERITY, c.CAUSE, c.SUMMARY,
                             "minutes", c.METRIC, "scope", c.PEAK, c.EXPECTED, c.SUBJECT,
                             c.INCIDENT_ID)),
    hide_index=True, key="incidents_table",
    column_config={"open": st.column_config.LinkColumn("open", display_text="details")},
)
if table.height:
    pick = st.selectbox("Open an incident", table[c.INCIDENT_ID].to_list(), key="inc_pick",
                        format_func=lambda i: f"{i} · " + str(
                            table.filter(pl.col(c.INCIDENT_ID) == i)[c.SUMMARY][0]))
    st.page_link("views/incident_detail.py", label="Show incident detail",
                 query_params={"id": pick}, icon=":material/troubleshoot:")
