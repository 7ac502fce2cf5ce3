"""Leaderboard: which model on which GPU serves best (``fleetlens leaderboard``'s numbers)."""

import plotly.graph_objects as go
import streamlit as st

from fleetlens.dashboard import data, ui
from fleetlens.pipeline.schema import columns as c

f = st.session_state["filters"]
st.title("Leaderboard")
board = data.load("leaderboard", f)
if board.is_empty():
    ui.empty_note("requests")
    st.stop()
st.caption("Ranked by `fleetlens leaderboard` (analytics) over the requests in range and scope, "
           "leaving out the newest window (still filling) and requests that arrived during an "
           "incident of their scope. Score: configured weights over min-max normalised p99 "
           "TTFT/TPOT/e2e, tokens/s per GPU and J/token (higher is better); rank intervals "
           "are bootstrap 95% over requests. Goodput per GPU and J/token at the knee are the last "
           "analytics run's capacity figures of the same model, GPU and TP (not scored; "
           "empty where a pool has no knee).")
ttft, tpot = c.percentile_column("ttft", "p99"), c.percentile_column("tpot", "p99")
e2e50, e2e99 = c.percentile_column("e2e", "p50"), c.percentile_column("e2e", "p99")
seconds = {col: st.column_config.NumberColumn(col, format="%.3f s")
           for col in (ttft, tpot, e2e50, e2e99, c.percentile_column("ttft", "p50"),
                       c.percentile_column("tpot", "p50"))}
st.dataframe(
    board.select(c.RANK, c.RANK_LO, c.RANK_HI, c.MODEL, c.GPU_MODEL, c.CONFIG, c.REQUESTS,
                 ttft, tpot, e2e50, e2e99, c.TOK_S_PER_GPU, c.J_PER_TOKEN, c.MEM_BW_UTIL,
                 c.GOODPUT_RPS_PER_GPU, c.J_PER_TOKEN_KNEE,
                 c.WEIGHTED_SCORE, c.ENTROPY_SCORE, c.PARETO),
    hide_index=True, key="lb_table", column_config={
        **seconds,
        c.TOK_S_PER_GPU: st.column_config.NumberColumn("tok/s per GPU", format="%.1f"),
        c.J_PER_TOKEN: st.column_config.NumberColumn("J/token", format="%.3f"),
        c.MEM_BW_UTIL: st.column_config.NumberColumn("HBM util", format="percent"),
        c.GOODPUT_RPS_PER_GPU: st.column_config.NumberColumn(
            "goodput/GPU at knee", format="%.2f req/s",
            help="Requests/s per GPU meeting every SLO at the pool's knee (Capacity page)"),
        c.J_PER_TOKEN_KNEE: st.column_config.NumberColumn(
            "J/token at knee", format="%.3f",
            help="GPU energy per output token at the pool's knee (Capacity page)"),
        c.WEIGHTED_SCORE: st.column_config.NumberColumn("score", format="%.3f"),
        c.ENTROPY_SCORE: st.column_config.NumberColumn("entropy score", format="%.3f"),
    })
# Short labels ("Llama-3.1-8B-Instruct on H100 tp=1") fit beside the points; the full names
# are in the table and in the hover text.
short = [f"{str(m).rsplit('/', 1)[-1]} on {str(g).removeprefix('NVIDIA ').split(' ')[0]} {cf}"
         for m, g, cf in board.select(c.MODEL, c.GPU_MODEL, c.CONFIG).iter_rows()]
full = [f"{m} on {g} ({cf})" for m, g, cf in board.select(c.MODEL, c.GPU_MODEL, c.CONFIG)
        .iter_rows()]
colours = ["#e45756" if p else "#4c78a8" for p in board[c.PARETO].to_list()]
fig = go.Figure(go.Scatter(
    x=board[e2e99].to_list(), y=board[c.J_PER_TOKEN].to_list(), mode="markers+text",
    text=short, hovertext=full, hoverinfo="text+x+y", textposition="top center",
    cliponaxis=False, marker={"size": 14, "color": colours}))
fig.update_layout(title="p99 e2e against J/token (red: on the Pareto front of all metrics)",
                  height=380, xaxis_title="p99 e2e (s)", yaxis_title="J/token",
                  margin={"l": 10, "r": 10, "t": 60, "b": 10})
# Room around the points so their labels are never cut off at the plot's edge.
for axis, values in (("xaxis", board[e2e99]), ("yaxis", board[c.J_PER_TOKEN])):
    lo, hi = values.min(), values.max()
    if lo is not None and hi is not None:
        pad = (hi - lo) * 0.35 or abs(hi) * 0.2 or 1.0
        fig.update_layout({axis: {"range": [lo - pad, hi + pad]}})
left, right = st.columns(2)
left.plotly_chart(fig, key="lb_pareto")
ranks = go.Figure(go.Scatter(
    x=board[c.RANK].to_list(), y=short, mode="markers", hovertext=full,
    error_x={"type": "data", "symmetric": False,
             "array": (board[c.RANK_HI] - board[c.RANK]).to_list(),
             "arrayminus": (board[c.RANK] - board[c.RANK_LO]).to_list()}))
ranks.update_layout(title="Rank with bootstrap 95% interval", height=380, xaxis_title="rank",
                    xaxis={"range": [0.5, board.height + 0.5], "dtick": 1},
                    yaxis={"autorange": "reversed", "automargin": True},
                    margin={"l": 10, "r": 10, "t": 60, "b": 10})
right.plotly_chart(ranks, key="lb_ranks")
