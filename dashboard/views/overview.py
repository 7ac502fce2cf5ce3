"""Fleet overview: is the fleet healthy right now, and where is it not?"""

import polars as pl
import streamlit as st

from fleetlens.analytics.open_incidents import active_incidents
from fleetlens.dashboard import charts as marks
from fleetlens.dashboard import data, ui
from fleetlens.dashboard.queries import HEADLINE
from fleetlens.pipeline.schema import columns as c

RECENT_WINDOWS = 5

f = st.session_state["filters"]
st.title("Fleet overview")
series = data.load("fleet_series", f)
if series.is_empty():
    ui.empty_note("windows")
    st.stop()
series = ui.with_time(series, c.WINDOW_START_NS)
# The newest window may still be filling, so the headline uses the complete ones before it.
complete = series.head(series.height - 1) if series.height > RECENT_WINDOWS + 1 else series
recent = complete.tail(RECENT_WINDOWS)
older = complete.slice(max(complete.height - 2 * RECENT_WINDOWS, 0), RECENT_WINDOWS)
st.caption(f"Last {RECENT_WINDOWS} complete windows against their baseline (or, without one, "
           f"the {RECENT_WINDOWS} before); latency percentiles are those of their requests. "
           f"Range: {series['time'].min()} to "
           f"{series['time'].max()} UTC; the charts leave out the newest window while it "
           "fills (its dip would look like an outage).")


def _mean(frame: pl.DataFrame, col: str) -> float | None:
    value = frame[col].mean() if frame.height else None
    return float(value) if value is not None else None


def _expected(col: str) -> float | None:
    band = data.load("fleet_band", f, col)
    start = recent[c.WINDOW_START_NS].min()
    band = band.filter(pl.col(c.TS_NS) >= start) if band.height else band
    return _mean(band, c.EXPECTED) if band.height else _mean(older, col)


# Latency percentiles of the recent windows are those of their requests together: a mean
# of five window p99s is not a p99.
_dropped = complete.height < series.height
exact = data.load("range_percentiles", f.with_range(
    int(recent[c.WINDOW_START_NS].min()),
    int(series[c.WINDOW_START_NS].max()) if _dropped else f.end_ns))


def _metric(slot, label: str, col: str, scale: float, unit: str, inverse: bool) -> None:  # noqa: ANN001
    now = exact.get(col) if col in exact else _mean(recent, col)
    expected = _expected(col)

    def shown(value: float) -> str:  # latencies in ms or s, whichever reads best
        return ui.duration(value) if unit == "s" else f"{value * scale:,.1f} {unit}"

    value = "n/a" if now is None else shown(now)
    delta = None if now is None or not expected else f"{100 * (now / expected - 1):+.0f}%"
    slot.metric(label, value, delta, delta_color="inverse" if inverse else "normal",
                help=None if expected is None else f"expected {shown(expected)}")


row = st.columns(4)
_metric(row[0], "Requests/s", c.RPS, 1, "req/s", False)
_metric(row[1], "Output tokens/s", c.OUTPUT_TOK_S, 1, "tok/s", False)
_metric(row[2], "Energy per token", c.J_PER_TOKEN, 1, "J/tok", True)
_metric(row[3], "Error rate", c.ERROR_RATE, 100, "%", True)
row = st.columns(len(HEADLINE))
for slot, (label, col) in zip(row, HEADLINE, strict=True):
    _metric(slot, label, col, 1, "s", True)

incidents = data.load("incidents", f)
# Active as the exporter's fleetlens_open_incidents counts it (analytics.open_incidents).
now_ns = data.load("closed_until")
active = active_incidents(incidents, now_ns)
left, right = st.columns([3, 2])
left.subheader(f"Active incidents: {active.height}")
left.caption(f"{incidents.height:,} incident(s) in range; active = not ended before the end of "
             "the latest closed window" + ("" if now_ns is None else
                                          f" ({ui.to_datetime(now_ns):%H:%M} UTC)") + ".")
shown = ui.with_time(incidents.head(20), c.START_NS, "started (UTC)")
left.dataframe(
    shown.select(pl.format("incident?id={}", c.INCIDENT_ID).alias("open"), "started (UTC)",
                 c.SEVERITY, c.CAUSE, c.HOST_NAME, c.METRIC, c.SUMMARY),
    hide_index=True, key="overview_incidents",
    column_config={"open": st.column_config.LinkColumn("open", display_text="open")},
)
right.subheader("Hosts ranked by trouble")
hosts = data.load("host_ranking", f)
right.dataframe(ui.readable(hosts), hide_index=True, key="overview_hosts", column_config={
    "e2e_vs_fleet": st.column_config.NumberColumn("p99 e2e / fleet median", format="%.2f"),
})

charts = [(c.RPS, "Requests/s"), (c.OUTPUT_TOK_S, "Output tokens/s"),
          (c.percentile_column("ttft", "p99"), "TTFT p99 (s)"),
          (c.percentile_column("e2e", "p99"), "E2E p99 (s)"),
          (c.percentile_column("tpot", "p99"), "TPOT p99 (s)"), (c.J_PER_TOKEN, "J/token")]
markers = data.load("failure_incidents", f)  # failures and restarts on every chart
for i in range(0, len(charts), 2):
    cols = st.columns(2)
    for slot, (col, title) in zip(cols, charts[i:i + 2], strict=True):
        band = data.load("fleet_band", f, col)
        slot.plotly_chart(marks.add_markers(ui.band_chart(complete, col, title, band=band),
                                            markers), key=f"chart_{col}")
