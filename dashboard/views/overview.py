"""Fleet overview: is the fleet healthy right now, and where is it not?"""

from dataclasses import replace

import polars as pl
import streamlit as st

from fleetlens.analytics.open_incidents import active_incidents
from fleetlens.dashboard import charts as marks
from fleetlens.dashboard import data, ui
from fleetlens.dashboard.filters import Filters
from fleetlens.dashboard.queries import HEADLINE
from fleetlens.pipeline.schema import FLEET_WIDE
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


def _span(frame: pl.DataFrame, end: int | None) -> tuple[int, int | None]:
    return int(frame[c.WINDOW_START_NS].min()), end


_dropped = complete.height < series.height
# The recent windows and the five before them, as ranges of requests.
RECENT = _span(recent, int(series[c.WINDOW_START_NS].max()) if _dropped else f.end_ns)
OLDER = _span(older, RECENT[0]) if older.height else None


def _expected(scope: Filters, col: str) -> float | None:
    """The band of exactly the series ``scope`` draws, or (no band) the same statistic
    over the five windows before."""
    band = data.load("fleet_band", scope, col)
    band = band.filter(pl.col(c.TS_NS) >= RECENT[0]) if band.height else band
    if band.height:
        return _mean(band, c.EXPECTED)
    if col in dict(HEADLINE).values():  # the percentile of the older windows' requests
        return None if OLDER is None else data.load(
            "range_percentiles", scope.with_range(*OLDER)).get(col)
    return _mean(older, col)


def _metric(slot, label: str, col: str, scale: float, unit: str, inverse: bool,  # noqa: ANN001
            scope: Filters = f) -> None:
    # Latency percentiles of the recent windows are those of their requests together: a
    # mean of five window p99s is not a p99.
    exact = data.load("range_percentiles", scope.with_range(*RECENT))
    now = exact.get(col) if col in exact else _mean(recent, col)
    expected = _expected(scope, col)

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
# One latency definition per tile: the p99 of one series' requests against that series'
# own band. Pooled over an 8B and a 70B model, a p99 is neither model's and no band was
# computed for it (a calm fleet read TPOT p99 +68%, red, all day).
scopes = data.load("scope_series", f)
if len(scopes) > 1:
    st.caption("Latency per service and model: each against its own baseline.")
for key in scopes if len(scopes) > 1 else [None]:
    scope = f if key is None else replace(
        f, services=(key[0],), models=(key[1],),
        hosts=(key[2],) if key[2] != FLEET_WIDE else f.hosts)
    row = st.columns(len(HEADLINE) + (key is not None))
    if key is not None:
        row[0].markdown(f"**{key[0]}**  \n{key[1]}" + (
            "" if key[2] == FLEET_WIDE else f"  \n{key[2]}"))
    for slot, (label, col) in zip(row[key is not None:], HEADLINE, strict=True):
        _metric(slot, label, col, 1, "s", True, scope)

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
                 c.SEVERITY, c.CAUSE, c.SUMMARY, c.HOST_NAME, c.METRIC),
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
          (c.percentile_column("tpot", "p99"), "TPOT p99 (s)"),
          (c.J_PER_TOKEN, "Energy per token (J/token)")]
markers = data.load("failure_incidents", f)  # failures and restarts on every chart
latency = {col for _, col in HEADLINE}
per_series = None
if len(scopes) > 1:  # one line per series, no band: no band describes their pool
    per_series = ui.with_time(data.load("series_percentiles", f), c.WINDOW_START_NS).filter(
        pl.col(c.WINDOW_START_NS) <= complete[c.WINDOW_START_NS].max())
for i in range(0, len(charts), 2):
    cols = st.columns(2)
    for slot, (col, title) in zip(cols, charts[i:i + 2], strict=True):
        if per_series is not None and col in latency:
            fig = ui.lines(per_series, col, "series", f"{title} per service and model")
        else:
            fig = ui.band_chart(complete, col, title, band=data.load("fleet_band", f, col))
        slot.plotly_chart(marks.add_markers(fig, markers), key=f"chart_{col}")
