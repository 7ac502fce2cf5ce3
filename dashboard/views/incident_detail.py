"""Incident detail: the spike, its phases, where it concentrates, what the signals did, why."""

import html
import json

import polars as pl
import streamlit as st

from fleetlens.analytics.detect import explain_detector
from fleetlens.analytics.units import signed_duration
from fleetlens.dashboard import charts, data, failure_view, ui
from fleetlens.dashboard.failures import is_failure
from fleetlens.dashboard.filters import Filters
from fleetlens.dashboard.incident import periods, report_markdown
from fleetlens.dashboard.ranking import analytics_config
from fleetlens.pipeline.schema import FLEET_WIDE
from fleetlens.pipeline.schema import columns as c


def _title(metric: str) -> str:
    """The metric with its unit: ``e2e_p99_s`` -> ``e2e_p99 (s)``."""
    return f"{metric.removesuffix('_s')} (s)" if metric.endswith("_s") else metric


f = st.session_state["filters"]
st.title("Incident detail")
listed = data.load("incidents", f)
wanted = st.query_params.get("id")
ids = listed[c.INCIDENT_ID].to_list() if listed.height else []
if wanted and wanted not in ids:
    ids.insert(0, wanted)
if not ids:
    ui.empty_note("incidents")
    st.stop()
# A link to another incident opens it, also one from this page (a failure's peers and
# back): the picker's own state would otherwise keep the incident shown before.
if wanted and st.session_state.get("_detail_wanted") != wanted:
    st.session_state["_detail_wanted"] = wanted
    st.session_state["detail_pick"] = wanted
incident_id = st.selectbox("Incident", ids, key="detail_pick")
inc = data.load("incident", incident_id)
if inc is None:
    st.warning(f"No incident with id {incident_id!r}.")
    st.stop()

p = periods(inc)
causes = data.load("causes", incident_id)
if is_failure(inc):  # what stopped, when, its evidence and its peers: no latency analysis
    failure_view.render(inc, causes)
    st.stop()
phases = data.load("phase_breakdown", inc)
top = causes.row(0, named=True) if causes.height else None
st.subheader(top[c.SUMMARY] if top else f"{inc[c.METRIC]} above its baseline")
cols = st.columns(5)
cols[0].metric("Severity", inc[c.SEVERITY])
cols[1].metric("Metric", inc[c.METRIC])
cols[2].metric("Peak", ui.duration(inc[c.PEAK]) if inc[c.METRIC].endswith("_s")
               else f"{inc[c.PEAK]:.3g}", ui.versus(inc[c.PEAK], inc[c.EXPECTED]),
               delta_color="inverse",
               help=None if inc[c.EXPECTED] is None else f"expected {inc[c.EXPECTED]:.3g}")
cols[3].metric("Duration", f"{(p['end'] - p['start']) / 6e10:.1f} min")
cols[4].metric("Scope", f"{inc[c.HOST_NAME]}", f"{inc[c.SERVICE_NAME]} / {inc[c.MODEL]}",
               delta_color="off")

root = failure_view.root_failure(causes)
if root:
    st.page_link("views/incident_detail.py", query_params={"id": root},
                 icon=":material/report:", label=f"Set off by a failure: {top[c.SUMMARY]}")
# Failures and restarts of the incident's service around it, on every chart of the page.
service = inc[c.SERVICE_NAME]
markers = data.load("failure_incidents", Filters(
    p["ctx_start"], p["ctx_end"], services=(service,) if service and service != FLEET_WIDE else ()))
context = ui.with_time(data.load("metric_context", inc), c.TS_NS)
band = context.select(c.TS_NS, c.EXPECTED, c.LOWER, c.UPPER).drop_nulls(c.EXPECTED)
# Every chart of the page on one time axis: the metric and each signal line up.
window = (p["ctx_start"], p["ctx_end"])
metric_fig = ui.band_chart(context.drop_nulls("value"), "value", _title(inc[c.METRIC]),
                           band=band, shade=(p["start"], p["end"]), height=320)
metric_fig.update_xaxes(range=[window[0] / 1e6, window[1] / 1e6])
st.plotly_chart(charts.add_markers(metric_fig, markers), key="detail_metric")
st.caption(explain_detector(inc[c.DETECTOR], analytics_config()))

left, right = st.columns(2)
left.subheader("Ranked causes")
if causes.height:
    left.dataframe(causes.select(c.RANK, c.CAUSE, c.SCORE, c.SUMMARY, c.SHARE_OF_EXCESS,
                                 c.SUBJECT), hide_index=True, key="detail_causes",
                   column_config={
                       c.SCORE: st.column_config.NumberColumn(
                           c.SCORE, format="%.2f", help="Evidence of the cause's own mechanism "
                           "x (0.1 + 0.9 x its share of the excess), 0..1 on one scale for every "
                           "cause and incident (docs/analytics.md, 'What score means')."),
                       c.SHARE_OF_EXCESS: st.column_config.NumberColumn(
                           "share of the excess", format="percent")})
    for row in causes.iter_rows(named=True):
        with left.expander(f"Evidence: {row[c.CAUSE]} ({row[c.SUBJECT]})"):
            try:
                st.json(json.loads(row[c.EVIDENCE] or "{}"))
            except json.JSONDecodeError:
                st.code(row[c.EVIDENCE])
else:
    left.info("No causes computed for this incident yet.")
right.subheader("Where the excess latency went")
period = data.load("compared_period", inc)
if phases.height:
    right.plotly_chart(charts.phase_excess_chart(phases), key="detail_phases")
    # The stored split, in the units `fleetlens explain` prints it ("+127.8 s", "-161 ms").
    right.dataframe(phases.select(
        c.PHASE, pl.col("excess_ms").map_elements(lambda ms: signed_duration(ms / 1000),
                                                  return_dtype=pl.String).alias("excess"),
        c.SHARE), hide_index=True, key="detail_phase_table", column_config={
        "excess": st.column_config.TextColumn("excess per request"),
        c.SHARE: st.column_config.NumberColumn("share of the excess", format="percent")})
    if period:
        right.caption(
            f"Against {ui.to_datetime(period[c.BASELINE_START_NS]):%H:%M} - "
            f"{ui.to_datetime(period[c.BASELINE_END_NS]):%H:%M} UTC "
            f"({period[c.BASELINE_REQUESTS]:,} requests; {period[c.INCIDENT_REQUESTS]:,} "
            "during the incident), other incidents of the service left out.")
else:
    right.info("Analytics split no latency for this incident (no requests compared).")

st.subheader("Dimensions: incident versus baseline")
st.caption(f"As analytics ranked them for the causes: requests slower than the baseline p90 "
           f"of {inc[c.METRIC]}'s request latency during the incident, against the baseline "
           "period's requests; lift > 1 means over-represented, share_of_excess is the part "
           "of the excess they carry.")
dims = data.load("dimension_compare", inc)
st.dataframe(dims, hide_index=True, key="detail_dims", column_config={
    c.LIFT: st.column_config.NumberColumn("lift", format="x%.1f"),
    c.SHARE_OF_EXCESS: st.column_config.NumberColumn("share of the excess", format="percent")})

st.subheader("Correlated signals")
signals = ui.with_time(data.load("signals", inc), c.TS_NS)
names = [col for col in ("arrivals_rps", "kv_usage_max", c.PREEMPTIONS, c.PREFIX_HIT_RATE,
                         c.SM_CLOCK_MHZ, c.POWER_W, c.POWER_LIMIT_W)
         if col in signals.columns and signals[col].null_count() < signals.height]
# Two per row: four were too narrow for their time axes (rotated, overlapping ticks).
for i in range(0, len(names), 2):
    cols = st.columns(2)
    for slot, name in zip(cols, names[i:i + 2], strict=False):
        slot.plotly_chart(charts.add_markers(charts.small_multiple(
            signals.drop_nulls(name), name, shade=(p["start"], p["end"]),
            x_range=window), markers), key=f"signal_{name}")
if "throttle_reasons" in signals.columns and signals["throttle_reasons"].drop_nulls().len():
    st.plotly_chart(charts.add_markers(charts.throttle_chart(
        signals.drop_nulls("throttle_reasons"), shade=(p["start"], p["end"]),
        x_range=window), markers), key="signal_throttle")

st.subheader("Slowest requests")
slow = data.load("slowest_requests", inc)
order = c.request_latency_column(str(inc[c.METRIC])) or c.E2E_S
first = list(dict.fromkeys(["trace", order, c.E2E_S, c.HOST_NAME]))
st.dataframe(
    ui.readable(slow.with_columns(  # the link and the latencies first: seen without scrolling
        pl.format("trace?id={}&t={}", c.TRACE_ID, c.ARRIVAL_NS).alias("trace"))
        .select(*first, pl.exclude(first))),
    hide_index=True, key="detail_slowest",
    column_config={"trace": st.column_config.LinkColumn("trace", display_text="waterfall")},
)
if slow.height:
    st.page_link("views/trace.py", label="Trace of the slowest request",
                 query_params={"id": slow[c.TRACE_ID][0], "t": str(slow[c.ARRIVAL_NS][0])},
                 icon=":material/account_tree:")
root = data.data_dir()


def _export(fmt: str) -> str:
    """Runs when an export button is clicked: the analytics report, else the page summary."""
    text, why = data.report_text(root, incident_id, fmt)
    if text is not None:
        return text
    summary = report_markdown(inc, causes, phases) + f"\n(analytics report unavailable: {why})\n"
    return summary if fmt == "markdown" else f"<pre>{html.escape(summary)}</pre>"


cols = st.columns(4)
cols[0].download_button("Export report (Markdown)", lambda: _export("markdown"),
                        key="detail_export", file_name=f"incident-{incident_id}.md",
                        mime="text/markdown")
cols[1].download_button("Export report (HTML)", lambda: _export("html"),
                        key="detail_export_html", file_name=f"incident-{incident_id}.html",
                        mime="text/html")
