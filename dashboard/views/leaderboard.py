"""Leaderboard: which model on which GPU gives the best latency per joule."""

import plotly.graph_objects as go
import streamlit as st

from fleetlens.dashboard import data, ui
from fleetlens.pipeline.schema import columns as c

f = st.session_state["filters"]
st.title("Leaderboard")
board = data.load("leaderboard", f)
if board.is_empty():
    ui.empty_note("windows")
    st.stop()
st.caption("Score: mean of min-max normalised p99 TTFT, p99 TPOT and J/token (lower is better);"
           " rank intervals are bootstrap 95% over windows.")
st.dataframe(board, hide_index=True, key="lb_table")
e2e99 = c.percentile_column("e2e", "p99")
labels = [f"{m} on {g}" for m, g in board.select(c.MODEL, c.GPU_MODEL).iter_rows()]
colours = ["#e45756" if p else "#4c78a8" for p in board["pareto"].to_list()]
fig = go.Figure(go.Scatter(x=board[e2e99].to_list(), y=board[c.J_PER_TOKEN].to_list(),
                           mode="markers+text", text=labels, textposition="top center",
                           marker={"size": 14, "color": colours}))
fig.update_layout(title="Pareto: p99 e2e against J/token (red: on the front)", height=360,
                  xaxis_title="p99 e2e (s)", yaxis_title="J/token")
left, right = st.columns(2)
left.plotly_chart(fig, key="lb_pareto")
ranks = go.Figure(go.Scatter(
    x=board["rank"].to_list(), y=labels, mode="markers",
    error_x={"type": "data", "symmetric": False,
             "array": (board["rank_hi"] - board["rank"]).to_list(),
             "arrayminus": (board["rank"] - board["rank_lo"]).to_list()}))
ranks.update_layout(title="Rank with 95% interval", height=360, xaxis_title="rank")
right.plotly_chart(ranks, key="lb_ranks")
