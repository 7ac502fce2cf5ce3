"""Trace explorer: a trace's spans as a waterfall, with queue/prefill/decode inside the engine,
over its instance's KV usage, batch, SM clock and power on the same time axis; every span's
attributes, resource attributes, events and links; the request's energy; and the request
side by side with another (``?vs=ID``) or the median request around it. The trace comes
from :func:`analytics.traces.detail.trace_detail`."""

import polars as pl
import streamlit as st

from fleetlens.analytics.traces.query import SearchError
from fleetlens.analytics.traces.side_by_side import side_by_side
from fleetlens.dashboard import data, trace_detail, ui
from fleetlens.pipeline.schema import columns as c

f = st.session_state["filters"]
st.title("Trace explorer")
ident = st.text_input("Trace id or request id", value=st.query_params.get("id", ""),
                      key="trace_lookup").strip()
if not ident:
    st.caption("Slowest requests in range; open one or paste an id above.")
    slow = data.load("slow_requests", f)
    if slow.is_empty():
        ui.empty_note("requests")
        st.stop()
    link = pl.format("trace?id={}&t={}", c.TRACE_ID, c.ARRIVAL_NS).alias("open")
    st.dataframe(ui.readable(slow.with_columns(link).select("open", pl.exclude("open"))),
                 hide_index=True, key="trace_slowest",
                 column_config={"open": st.column_config.LinkColumn("open",
                                                                    display_text="waterfall")})
    st.stop()
# A link carries the request's arrival (t) so the lookup scans an hour, not all the data.
hint = st.query_params.get("t", "")
around = int(hint) if hint.isdigit() and ident == st.query_params.get("id") else None
try:
    detail = data.load("trace_detail", ident, around)
except SearchError:
    st.warning(f"No trace or request with id {ident!r}.")
    st.stop()
trace_id, reqs = detail.trace_id, detail.requests
st.plotly_chart(trace_detail.figure(detail), key="trace_waterfall")
st.download_button("Download OTLP/JSON", data.load("trace_otlp_json", trace_id, around),
                   file_name=f"trace-{trace_id}.json", mime="application/json",
                   key="trace_export", icon=":material/download:",
                   help="The trace's spans as OTLP/JSON: load it into Jaeger or Tempo, or POST "
                        "it to an OTLP/HTTP receiver's /v1/traces.")
cols = st.columns(5)
if reqs.height:
    r = reqs.row(0, named=True)
    cols[0].metric("E2E", ui.duration(r[c.E2E_S]))
    cols[1].metric("Queue", ui.duration(r[c.QUEUE_S]))
    cols[2].metric("Prefill", ui.duration(r[c.PREFILL_S]))
    cols[3].metric("Decode", ui.duration(r[c.DECODE_S]))
    cols[4].metric("Energy", ui.energy(r[c.ENERGY_J]),
                   help="Its share of its GPUs' measured energy while it ran (by tokens "
                        f"processed); attribution coverage {r[c.ATTRIBUTION_COVERAGE] or 0:.0%}.")
for name, frame, what in (("trace_spans", detail.spans, None),
                          ("trace_requests", reqs, None),
                          ("trace_attributes", detail.attributes, "Attributes"),
                          ("trace_events", detail.events, "Events"),
                          ("trace_links", detail.links, "Links"),
                          ("trace_signals", detail.signals, "Instance signals")):
    if what:
        st.subheader(what)
        if frame.is_empty():
            st.caption("None stored for this trace.")
            continue
    shown = trace_detail.times(frame)
    st.dataframe(shown, hide_index=True, key=name, column_config=trace_detail.time_columns(shown))

# Side by side (issue 35 item 4): another request (?vs=ID) or, by default, the median
# request of its service and model within five minutes; computed in analytics.
if reqs.height:
    st.subheader("Compared with")
    vs = st.text_input("Another request or trace id (empty: the median request of its "
                       "service and model within 5 min)", value=st.query_params.get("vs", ""),
                       key="trace_vs").strip()
    if vs != st.query_params.get("vs", ""):
        if vs:
            st.query_params["vs"] = vs
        else:
            del st.query_params["vs"]
    try:
        a = data.load("request_row", reqs[c.REQUEST_ID][0])
        b = data.load("request_row", vs) if vs else data.load("median_row", a)
    except SearchError as exc:
        st.error(str(exc))
        st.stop()
    other = (f"{b[c.REQUEST_ID]} ({b[c.HOST_NAME]})" if vs else
             f"median of {b['requests']:,} requests")
    st.dataframe(side_by_side(a, b).rename({"a": f"this ({a[c.HOST_NAME]})", "b": other}),
                 hide_index=True, key="trace_side_by_side")
