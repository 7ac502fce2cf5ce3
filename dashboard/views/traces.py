"""Traces: search requests by the sidebar's scope and any latency, token or span attribute
filter; each row with its phase split and a link into the trace explorer. Above them, the
search's latency heatmap: a box drawn on it lists what is different about the selected
requests. The search, the grid and the comparison run in analytics (analytics.traces.search,
.heatmap, .compare); this page renders their results."""

import dataclasses

import plotly.graph_objects as go
import polars as pl
import streamlit as st

from fleetlens.analytics.traces.query import SearchError, TraceQuery
from fleetlens.dashboard import data, trace_heatmap, trace_search, ui
from fleetlens.pipeline.schema import columns as c


def heatmap_section(query: TraceQuery) -> None:
    """The latency heatmap of every request of the search; a box drawn on it (or a link's
    hm_* parameters) compares the selected requests with the rest (analytics.traces.compare)
    and lists the top differences, each linked to its selected requests."""
    st.subheader("Latency heatmap")
    metric = st.selectbox("Latency", trace_heatmap.LABELS, key="hm_metric",
                          format_func=trace_heatmap.LABELS.get)
    view = dataclasses.replace(query, sort=c.ARRIVAL_NS, descending=True, offset=0)
    # The grid reads two columns; the whole view only once a selection is compared.
    grid = data.load_derived("trace_heatmap", ("trace_view_metric", view, metric), metric,
                             min_width_s=60)
    if not grid.total:
        st.info(f"No request of this search has a {trace_heatmap.LABELS[metric]}.")
        return
    state = st.session_state
    try:
        selection = trace_heatmap.selection_of(state, view)
    except SearchError as exc:
        st.error(str(exc))
        return
    event = st.plotly_chart(trace_heatmap.figure(grid, selection), key=f"hm_chart_{metric}",
                            on_select="rerun", selection_mode="box")
    boxes = (event or {}).get("selection", {}).get("box", [])
    if boxes and boxes[-1] != state.get("hm_box_seen"):  # a new box: it replaces the selection
        state["hm_box_seen"] = boxes[-1]
        state["hm_sel"] = trace_heatmap.from_box(boxes[-1], grid)
        trace_heatmap.write(st.query_params, state)
        st.rerun()
    trace_heatmap.write(st.query_params, state)
    if selection is None:
        st.caption("Drag a box over the heatmap (a time span and a latency band) to see what "
                   "is different about those requests.")
        return
    if st.button("Clear selection", key="hm_clear"):
        state["hm_sel"] = None
        st.rerun()
    result = data.load_derived("trace_compare", ("trace_view", view), selection, view)
    st.caption(f"{result.selected:,} requests selected, {result.rest:,} in the rest of the view")
    if not result.differences:
        st.info("No dimension value stands out in the selection.")
        return
    shown = pl.DataFrame([{
        "traces": trace_heatmap.link(d.query) if d.query else f"trace?id={d.trace_ids[0]}",
        "difference": f"{d.dimension}={d.value}", "selected": d.selected_share,
        "rest": d.rest_share, "lift": d.lift, "share of excess": d.share_of_excess,
        "note": d.note(),
    } for d in result.differences])
    pct = st.column_config.NumberColumn(format="percent")
    st.dataframe(shown, hide_index=True, key="hm_differences", column_config={
        "traces": st.column_config.LinkColumn("traces", display_text="open"),
        "selected": pct, "rest": pct, "share of excess": pct,
        "lift": st.column_config.NumberColumn(format="x%.1f")})


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
cols = st.columns([4, 2, 2, 2, 1])
cols[0].text_area("Span attributes, one per line: KEY, KEY=V, KEY!=V, KEY>N (>=, <, <=)",
                  key="ts_attr", height=68, placeholder="gen_ai.request.max_tokens>=1024")
cols[1].text_input("Finish reasons (comma-separated)", key="ts_finish")
cols[2].text_input("Engine instances (comma-separated)", key="ts_instance")
cols[3].text_input("GPU UUIDs (comma-separated)", key="ts_gpu")
cols[4].number_input("Page", min_value=1, step=1, key="ts_page")
trace_search.write(st.query_params, state)
trace_heatmap.seed(state, {k: st.query_params.get_all(k) for k in st.query_params})

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
heatmap_section(result.query)
st.subheader("Requests")

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
