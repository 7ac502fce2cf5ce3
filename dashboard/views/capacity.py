"""Capacity: per pool the elasticity curve with its knee and today's operating point, the MBU
heatmap and the headroom left, as analytics stored them (`capacity`, `capacity_curve`,
`capacity_windows`)."""

import plotly.graph_objects as go
import polars as pl
import streamlit as st

from fleetlens.dashboard import data, ui
from fleetlens.dashboard.capacity_view import pool_label
from fleetlens.pipeline.schema import columns as c

_TPOT50, _TPOT99 = c.percentile_column("tpot", "p50"), c.percentile_column("tpot", "p99")
_POOL = [c.SERVICE_NAME, c.MODEL, c.GPU_MODEL, c.TP, c.CONFIG]


def _num(value: float | None, fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def _of(frame: pl.DataFrame, pool: dict) -> pl.DataFrame:
    return frame.filter(pl.all_horizontal([pl.col(k) == pool[k] for k in _POOL]))


def _curve_chart(pool: dict, curve: pl.DataFrame, points: pl.DataFrame) -> go.Figure:
    """TPOT p99 against batch: the windows visited, the fit and its band (dashed where no
    window visited the batch), the TPOT SLO, the knee and the operating point now."""
    fig = go.Figure()
    x = ui.ys(curve, c.BATCH)
    fig.add_trace(go.Scatter(x=x, y=ui.ys(curve, c.TPOT_BAND_HI_S), mode="lines",
                             line={"width": 0}, showlegend=False, hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=x, y=ui.ys(curve, c.TPOT_BAND_LO_S), mode="lines",
                             line={"width": 0}, fill="tonexty", name="fit 90% band"))
    seen = curve.filter(pl.col(c.VISITED))
    fig.add_trace(go.Scatter(x=ui.ys(seen, c.BATCH), y=ui.ys(seen, c.TPOT_P99_FIT_S),
                             mode="lines", name="TPOT p99 fit (visited)"))
    fig.add_trace(go.Scatter(x=x, y=ui.ys(curve, c.TPOT_P99_FIT_S), mode="lines",
                             line={"dash": "dot"}, name="TPOT p99 fit (extrapolated)"))
    fig.add_trace(go.Scatter(x=ui.ys(points, c.BATCH), y=ui.ys(points, _TPOT99),
                             mode="markers", marker={"opacity": 0.4, "size": 5},
                             name="windows (instance)"))
    if pool[c.TPOT_SLO_S] is not None:
        fig.add_hline(y=pool[c.TPOT_SLO_S], line_dash="dash", annotation_text="TPOT SLO")
    if pool[c.KNEE_BATCH] is not None:
        fig.add_vline(x=pool[c.KNEE_BATCH], line_color="red",
                      annotation_text=f"knee {pool[c.KNEE_BATCH]:.0f} ({pool[c.KNEE_LIMIT]})")
    if pool[c.BATCH_NOW] is not None:
        fig.add_vline(x=pool[c.BATCH_NOW], line_color="green", annotation_text="now",
                      annotation_position="bottom right")
    fig.update_layout(title=pool_label(pool), height=320, xaxis_title="running batch",
                      yaxis_title="TPOT p99 (s)", margin={"l": 10, "r": 10, "t": 40, "b": 10})
    return fig


def _heatmap(points: pl.DataFrame) -> go.Figure:
    """MBU per instance (rows) and window (columns)."""
    grid = (ui.with_time(points, c.WINDOW_START_NS).sort("time")
            .pivot(on="time", index=c.INSTANCE_ID, values=c.MBU, aggregate_function="mean"))
    times = grid.columns[1:]
    fig = go.Figure(go.Heatmap(z=grid.select(times).to_numpy(), x=times,
                               y=grid[c.INSTANCE_ID].to_list(), zmin=0, zmax=1,
                               colorbar={"title": "MBU"}))
    fig.update_layout(title="Model bandwidth utilisation per instance", height=300,
                      margin={"l": 10, "r": 10, "t": 40, "b": 10})
    return fig


f = st.session_state["filters"]
st.title("Capacity")
pools = data.load("capacity_pools", f)
if pools.is_empty():
    ui.empty_note("capacity rows (run `fleetlens analyze`)")
    st.stop()
curves = data.load("capacity_curve", f)
points = data.load("capacity_points", f)
fitted = pools.filter(pl.col(c.KNEE_BATCH).is_not_null())
cols = st.columns(4)
cols[0].metric("Pools", pools.height)
least = fitted.drop_nulls(c.HEADROOM_X).sort(c.HEADROOM_X).head(1)
cols[1].metric("Least headroom", "n/a" if least.is_empty() else
               f"x{least[c.HEADROOM_X][0]:.2f}",
               help="Arrival-rate multiplier left before the knee, of the tightest pool.")
cols[2].metric("Goodput/GPU at knees", _num(fitted[c.GOODPUT_RPS_PER_GPU].sum()
                                            if fitted.height else None, ".2f"),
               help="Requests/s per GPU meeting every SLO at each pool's knee, summed.")
cols[3].metric("Mean MBU now", _num(pools[c.MBU].mean(), ".0%"))

st.subheader("Headroom per pool")
shown = pools.with_columns(pl.struct(_POOL).map_elements(pool_label, return_dtype=pl.String)
                           .alias("pool"))
fig = go.Figure(go.Bar(x=ui.ys(shown, c.HEADROOM_X), y=shown["pool"].to_list(),
                       orientation="h"))
fig.add_vline(x=1.0, line_dash="dash", annotation_text="knee")
fig.update_layout(height=60 + 40 * shown.height, xaxis_title="headroom (x rps now)",
                  margin={"l": 10, "r": 10, "t": 10, "b": 10})
st.plotly_chart(fig, key="cap_headroom")
for pool in pools.filter(pl.col(c.CROSSING_NS).is_not_null()).iter_rows(named=True):
    when = ui.with_time(pl.DataFrame({c.TS_NS: [pool[c.CROSSING_NS]]}), c.TS_NS)["time"][0]
    st.warning(f"{pool_label(pool)}: the demand forecast passes the knee "
               f"({pool[c.KNEE_RPS]:.2f} req/s) at {when:%a %H:%M} UTC (peak "
               f"{pool[c.FORECAST_PEAK_RPS]:.2f} req/s): about {pool[c.GPUS_NEEDED]} more GPUs.")

st.subheader("Elasticity curves")
for i, pool in enumerate(pools.iter_rows(named=True)):
    if pool[c.KNEE_BATCH] is None:
        st.caption(f"{pool_label(pool)}: {pool[c.WINDOWS_USED]} usable windows, too few "
                   "to fit a curve.")
        continue
    if pool[c.EXTRAPOLATED]:
        st.warning(f"{pool_label(pool)}: the knee lies beyond the largest batch visited "
                   f"({pool[c.BATCH_MAX]:.0f}): extrapolated.")
    st.plotly_chart(_curve_chart(pool, _of(curves, pool), _of(points, pool)),
                    key=f"cap_curve_{i}")

if not points.is_empty() and points[c.MBU].is_not_null().any():
    st.subheader("MBU")
    st.plotly_chart(_heatmap(points.drop_nulls(c.MBU)), key="cap_mbu")
st.subheader("Per pool")
st.dataframe(shown.drop(c.TS_NS), hide_index=True, key="cap_table", column_config={
    col: st.column_config.NumberColumn(col, format="percent")
    for col in (c.MBU, c.MFU, c.ROOFLINE_GAP)})
