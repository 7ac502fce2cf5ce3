"""Traces: search requests by the sidebar's scope and any latency, token or span attribute
filter; each row with its phase split and a link into the trace explorer. The search runs in
analytics (analytics.traces.search); this page renders its result."""

import plotly.graph_objects as go
import polars as pl
import streamlit as st

from fleetlens.analytics.traces.query import SearchError
from fleetlens.dashboard import data, trace_search, ui
from fleetlens.pipeline.schema import columns as c

f = st.session_state["filters"]
state = st.session_state
st.title("Traces")
trace_search.seed(state, {k: st.query_params.get_all(k) for k in st.query_params})
cols = st.columns([2, 2, 1, 1, 1])
cols[0].text_input("At least (column=N, ...)", key="ts_min",
                   placeholder=f"{c.E2E_S}=2, {c.INPUT_TOKENS}=4000")
cols[1].text_input("At most (column=N, ...)", key="ts_max", placeholder=f"{c.TTFT_S}=0.5")
cols[2].selectbox("Errors", list(trace_search.ERRORS), key="ts_errors")
cols[3].selectbox("Sort by", trace_search.SORTS, key="ts_sort")
cols[4].checkbox("Descending", key="ts_desc")
cols = st.columns([4, 2, 1])
cols[0].text_area("Span attributes, one per line: KEY, KEY=V, KEY!=V, KEY>N (>=, <, <=)",
                  key="ts_attr", height=68, placeholder="gen_ai.request.max_tokens>=1024")
cols[1].text_input("Finish reasons (comma-separated)", key="ts_finish")
cols[2].number_input("Page", min_value=1, step=1, key="ts_page")
trace_search.write(st.query_params, state)

try:
    result = data.load("trace_search", trace_search.query_of(f, state))
except SearchError as exc:
    st.error(str(exc))
    st.stop()
rows = result.rows
first = result.query.offset + 1
if rows.is_empty():
    st.info(f"No request matches ({result.total:,} in all: page {state['ts_page']} is past "
            "the last)." if result.total else "No request matches these filters.")
    st.stop()
st.caption(f"requests {first:,}-{result.query.offset + rows.height:,} of {result.total:,}")

# The phase split of each request on the page, slowest first as sorted.
label = pl.format("{} {}", pl.col(c.HOST_NAME), pl.col(c.TRACE_ID).str.slice(0, 8))
bars = rows.with_columns(label.alias("label"))
fig = go.Figure()
for phase, column in (("queue", c.QUEUE_S), ("prefill", c.PREFILL_S), ("decode", c.DECODE_S),
                      ("overhead", c.OVERHEAD_S)):
    fig.add_trace(go.Bar(y=bars["label"].to_list(), x=(bars[column] * 1e3).to_list(),
                         name=phase, orientation="h",
                         marker={"color": ui.PHASE_COLOURS[phase]}))
fig.update_layout(barmode="stack", height=120 + 18 * rows.height, xaxis_title="ms",
                  yaxis={"autorange": "reversed"},
                  legend={**ui.LEGEND_ON_TOP, "traceorder": "normal"},
                  margin={"l": 10, "r": 10, "t": 30, "b": 10})
st.plotly_chart(fig, key="traces_phases")

table = rows.with_columns(pl.format("trace?id={}&t={}", c.TRACE_ID, c.ARRIVAL_NS).alias("open"))
shown = ["open", c.ARRIVAL_NS, c.SERVICE_NAME, c.MODEL, c.HOST_NAME, c.E2E_S, c.QUEUE_S,
         c.PREFILL_S, c.DECODE_S, c.OVERHEAD_S, c.TTFT_S, c.TPOT_S, c.INPUT_TOKENS,
         c.OUTPUT_TOKENS, c.CACHED_TOKENS, c.FINISH_REASON, c.IS_ERROR, c.INSTANCE_ID,
         c.TRACE_ID, c.REQUEST_ID]
st.dataframe(ui.readable(table.select([name for name in shown if name in table.columns])),
             hide_index=True, key="traces_table",
             column_config={"open": st.column_config.LinkColumn("open",
                                                                display_text="waterfall")})
if result.next_offset is not None:
    st.caption(f"Page {state['ts_page']}: the next page holds requests "
               f"{result.next_offset + 1:,}-"
               f"{min(result.next_offset + trace_search.PAGE_SIZE, result.total):,}.")
