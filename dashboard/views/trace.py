"""Trace explorer: a trace's spans as a waterfall, with queue/prefill/decode inside the engine;
its request side by side with another (``?vs=ID``) or the median request around it."""

import plotly.graph_objects as go
import polars as pl
import streamlit as st

from fleetlens.analytics.traces.query import SearchError
from fleetlens.analytics.traces.side_by_side import side_by_side
from fleetlens.dashboard import data, ui
from fleetlens.dashboard.explore import waterfall
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
spans = data.load("find_trace", ident, around)
if spans.is_empty():
    st.warning(f"No trace or request with id {ident!r}.")
    st.stop()
trace_id = spans[c.TRACE_ID][0]
reqs = data.load("trace_requests", trace_id, around)
bars = waterfall(spans, reqs)
fig = go.Figure()
for kind, part in bars.group_by("kind", maintain_order=True):
    name = kind[0]
    fig.add_trace(go.Bar(y=part["label"].to_list(), x=part["duration_ms"].to_list(),
                         base=part["start_ms"].to_list(), orientation="h", name=name,
                         marker={"color": ui.PHASE_COLOURS.get(name, "#999")},
                         width=0.8 if name == "span" else 0.4))
fig.update_layout(barmode="overlay", height=120 + 40 * spans.height,
                  xaxis_title="ms since trace start", yaxis={"autorange": "reversed"},
                  title=f"Trace {trace_id}", margin={"l": 10, "r": 10, "t": 40, "b": 10})
st.plotly_chart(fig, key="trace_waterfall")
st.download_button("Download OTLP/JSON", data.load("trace_otlp_json", trace_id, around),
                   file_name=f"trace-{trace_id}.json", mime="application/json",
                   key="trace_export", icon=":material/download:",
                   help="The trace's spans as OTLP/JSON: load it into Jaeger or Tempo, or POST "
                        "it to an OTLP/HTTP receiver's /v1/traces.")
cols = st.columns(4)
if reqs.height:
    r = reqs.row(0, named=True)
    cols[0].metric("E2E", ui.duration(r[c.E2E_S]))
    cols[1].metric("Queue", ui.duration(r[c.QUEUE_S]))
    cols[2].metric("Prefill", ui.duration(r[c.PREFILL_S]))
    cols[3].metric("Decode", ui.duration(r[c.DECODE_S]))
st.dataframe(ui.readable(spans), hide_index=True, key="trace_spans")
st.dataframe(ui.readable(reqs), hide_index=True, key="trace_requests")

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
