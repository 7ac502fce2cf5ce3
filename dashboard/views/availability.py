"""Availability: is every engine up, what failed and when, and how many requests failed."""

import polars as pl
import streamlit as st

from fleetlens.dashboard import charts, data, slo_view, ui
from fleetlens.dashboard.failure_view import incident_table
from fleetlens.pipeline.schema import columns as c

f = st.session_state["filters"]
st.title("Availability")
timeline = data.load("engine_timeline", f)
errors = data.load("error_series", f)
if timeline.is_empty() and errors.is_empty():
    ui.empty_note("engine samples or windows")
    st.stop()
failures = data.load("failure_incidents", f)
restarts = data.load("engine_restarts", f)
st.caption("Each engine as its host agent scraped it: up, down (the scrape failed) or no "
           "data (nothing arrived from its agent). Shaded bands and dashed lines on every "
           "time chart are the failures and restarts analytics found; hover their labels.")

# The newest run of each engine: not up there means down (or silent) at the end of range.
latest = timeline.sort(c.START_NS).group_by(c.INSTANCE_ID).last()
not_up = latest.filter(pl.col("state") != "up")
total = int(errors[c.REQUESTS].sum() or 0) if errors.height else 0
failed = float(errors["failed"].sum() or 0) if errors.height else 0.0
cols = st.columns(4)
cols[0].metric("Engines", latest.height)
cols[1].metric("Not up at the end of the range", not_up.height,
               ", ".join(not_up[c.INSTANCE_ID].to_list()) or None, delta_color="off",
               delta_arrow="off")
cols[2].metric("Failure incidents", failures.height)
cols[3].metric("Requests failed", f"{failed:,.0f} of {total:,}",
               f"{failed / total:.2%}" if total else None, delta_color="off",
               delta_arrow="off",
               help="Failed requests include those the gateway answered because no engine "
                    "did (source gateway).")


def markers(service: str) -> pl.DataFrame:
    """The failures of ``service``'s engines and hosts: another service's outage is not news
    on its charts."""
    hosts = timeline.filter(pl.col(c.SERVICE_NAME) == service)[c.HOST_NAME].unique()
    return failures.filter(pl.col(c.HOST_NAME).is_in(hosts.to_list())
                           | (pl.col(c.SERVICE_NAME) == service))


st.subheader("Engines: up, down, no data")
for i, ((service,), part) in enumerate(timeline.sort(c.SERVICE_NAME)
                                       .group_by(c.SERVICE_NAME, maintain_order=True)):
    fig = charts.availability_timeline(
        part, restarts.filter(pl.col(c.INSTANCE_ID).is_in(part[c.INSTANCE_ID].to_list())),
        f"{service}: {part[c.INSTANCE_ID].n_unique()} engine(s)")
    st.plotly_chart(charts.add_markers(fig, markers(service)), key=f"avail_timeline_{i}")

st.subheader("Error rate")
if errors.height:
    fig = ui.lines(ui.with_time(errors, c.WINDOW_START_NS), c.ERROR_RATE, c.SERVICE_NAME,
                   "Failed requests / requests, per window and service")
    fig.update_yaxes(tickformat=".0%", rangemode="tozero")
    st.plotly_chart(charts.add_markers(fig, failures), key="avail_errors")
else:
    ui.empty_note("windows")

st.subheader(f"Failure incidents: {failures.height}")
if failures.height:
    st.dataframe(incident_table(failures), hide_index=True, key="avail_failures",
                 column_config={"open": st.column_config.LinkColumn("open",
                                                                    display_text="details")})
else:
    st.caption("Analytics found no failure in this range and scope.")

st.divider()
# Kept apart on purpose: the SLOs' budgets and burn rates are what analytics stored
# (`slo_*` tables, [analytics.slos]); nothing here is derived from the error rate above.
st.subheader("SLOs and error budget")
services = set(errors[c.SERVICE_NAME].to_list()) if errors.height else set()
slo_view.render(f, sorted(services), markers)
