"""KV cache: usage and headroom per instance, preemptions, prefix hits, and the latency link."""

import plotly.graph_objects as go
import polars as pl
import streamlit as st

from fleetlens.dashboard import charts, data, now, ui
from fleetlens.pipeline.schema import columns as c

f = st.session_state["filters"]
st.title("KV cache")
frame = data.load("kv_instances", f)
if frame.is_empty():
    ui.empty_note("engine samples")
    st.stop()
frame = ui.with_time(frame, c.TS_NS)
summary = data.load("kv_summary", f)  # analytics' definitions (fleetlens analyze's)
# The headroom headline reads the cache now (the last minutes), not the range's worst: it
# said 1% an hour after an incident's full cache had emptied.
current = data.load("kv_summary_now", f)
cols = st.columns(5)
cols[0].metric("Instances", summary.height)
cols[1].metric("Peak KV usage (range)", f"{100 * summary['kv_usage_max'].max():.0f}%")
cols[2].metric("Least headroom now", "n/a" if current.is_empty()
               else f"{100 * current[c.KV_HEADROOM].min():.0f}%",
               help=f"1 - the 95th percentile of KV usage over the last "
                    f"{now.RECENT_S // 60} minutes, of the fullest instance.")
cols[3].metric("Preemptions", f"{int(summary[c.PREEMPTIONS].sum()):,}")
hit = summary[c.PREFIX_HIT_RATE].mean()
cols[4].metric("Prefix hit rate", "n/a" if hit is None else f"{100 * hit:.0f}%",
               help="Mean over instances of each one's token-level hit rate.")

top = summary.head(8)[c.INSTANCE_ID].to_list()  # the fullest eight
busy = frame.filter(pl.col(c.INSTANCE_ID).is_in(top))
markers = data.load("failure_incidents", f)  # a restart empties the cache: mark it
left, right = st.columns(2)
left.plotly_chart(charts.add_markers(ui.lines(busy, "kv_usage", c.INSTANCE_ID,
                                              "KV usage, 8 fullest instances"), markers),
                  key="kv_usage")
right.plotly_chart(charts.add_markers(ui.lines(busy, "preemptions", c.INSTANCE_ID,
                                               "Preemptions per window"), markers),
                   key="kv_preemptions")
left.plotly_chart(charts.add_markers(ui.lines(
    busy.drop_nulls(c.PREFIX_HIT_RATE), c.PREFIX_HIT_RATE, c.INSTANCE_ID,
    "Prefix cache hit rate (tokens)"), markers), key="kv_prefix")
scatter = data.load("kv_vs_latency", f)
queue = c.percentile_column("queue", "p99")
fig = go.Figure(go.Scatter(x=ui.ys(scatter, c.KV_CACHE_USAGE_MEAN), y=ui.ys(scatter, queue),
                           mode="markers", marker={"opacity": 0.5}))
fig.update_layout(title="Queue time p99 against KV usage (host windows)", height=280,
                  xaxis_title="mean KV usage", yaxis_title="queue p99 (s)",
                  margin={"l": 10, "r": 10, "t": 40, "b": 10})
right.plotly_chart(fig, key="kv_scatter")
st.subheader("Per instance")
st.caption(f"Over the range; kv_headroom_now over the last {now.RECENT_S // 60} minutes.")
NOW = f"{c.KV_HEADROOM}_now"
table = summary.join(current.select(c.INSTANCE_ID, pl.col(c.KV_HEADROOM).alias(NOW)),
                     on=c.INSTANCE_ID, how="left") if current.height else summary
key = [c.INSTANCE_ID, c.HOST_NAME, *([NOW] if NOW in table.columns else []), c.KV_HEADROOM]
st.dataframe(table.select(*key, pl.exclude(key)), hide_index=True, key="kv_table",
             column_config={col: st.column_config.NumberColumn(col, format="percent")
                            for col in ("kv_usage_mean", "kv_usage_p95", "kv_usage_max",
                                        c.KV_HEADROOM, NOW, c.PREFIX_HIT_RATE)})
