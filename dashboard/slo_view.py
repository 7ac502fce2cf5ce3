"""The availability page's "SLOs and error budget" section, per service: each SLO's target,
compliance and error budget left, its burn rate per alert window, the burn-rate alerts
firing, and the budget spent over the compliance period with the failures marked.

It renders the `slo_*` rows the latest analytics run stored (:mod:`dashboard.slos`); a
service without an SLO gets the way to configure one, never a number made up here.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import polars as pl
import streamlit as st

from fleetlens.dashboard import charts, data, ui
from fleetlens.dashboard.failure_view import span_text
from fleetlens.dashboard.filters import Filters
from fleetlens.pipeline.schema import columns as c

NS = 1_000_000_000
CONFIGURE = ("No SLO configured for **{service}**. Add one under `[analytics.slos]` in "
             "`fleetlens.toml` (docs/operations.md, \"SLOs and burn-rate alerts\"); the next "
             "analytics run computes its error budget and burn rates.")
_MARKDOWN = str.maketrans({ch: "\\" + ch for ch in "\\`*_[]<>#|~$:"})


def md(text: str) -> str:
    """``text`` with Markdown's special characters escaped (service names are free text)."""
    return str(text).translate(_MARKDOWN)


def window_label(seconds: int) -> str:
    """An alert window as people write it: 300 -> ``5m``, 3600 -> ``1h``, 259200 -> ``3d``."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def utc(ns: int) -> str:
    return dt.datetime.fromtimestamp(ns / NS, tz=dt.UTC).strftime("%Y-%m-%d %H:%M")


def period(seconds: int) -> str:
    """A compliance period: ``30 days`` (a whole number of days) or a duration."""
    days, rest = divmod(int(seconds), 86400)
    return f"{days} day{'s' if days > 1 else ''}" if days and not rest else span_text(seconds)


def target(row: dict) -> str:
    """The SLO in words: ``99.9% of requests succeed``, ``ttft <= 0.12 s for 90%``."""
    if row[c.THRESHOLD_S] is None:
        return f"{row[c.OBJECTIVE] * 100:.4g}% of requests succeed"
    return f"{row[c.METRIC]} <= {row[c.THRESHOLD_S]:g} s for {row[c.OBJECTIVE] * 100:.4g}%"


def status_table(status: pl.DataFrame) -> pl.DataFrame:
    """One row per SLO: its target, compliance, budget left (0..1) and spent, events."""
    rows = status.to_dicts()
    return pl.DataFrame({
        c.SLO: [r[c.SLO] for r in rows],
        "target": [target(r) for r in rows],
        "compliance": [None if r[c.COMPLIANCE] is None else f"{r[c.COMPLIANCE]:.3%}"
                       for r in rows],
        "budget left": [r[c.BUDGET_REMAINING] for r in rows],
        "budget spent": [f"{r[c.BUDGET_CONSUMED]:.0%}" for r in rows],
        "bad / events": [f"{r[c.BAD_EVENTS]:,} / {r[c.TOTAL_EVENTS]:,}" for r in rows],
    }, schema_overrides={"budget left": pl.Float64, "compliance": pl.String})


def burn_table(rates: pl.DataFrame) -> pl.DataFrame:
    """SLOs by alert window (shortest first): the burn rate, null without events."""
    if rates.is_empty():
        return pl.DataFrame()
    labelled = rates.sort(c.WINDOW_S).with_columns(
        pl.col(c.WINDOW_S).map_elements(window_label, return_dtype=pl.String).alias("window"))
    return labelled.pivot(on="window", index=c.SLO, values=c.BURN_RATE, maintain_order=True)


def alert_text(row: dict) -> str:
    """A firing alert in one line: severity, SLO, both burn rates against the factor, since."""
    return (f"**{row[c.SEVERITY].upper()}** · {md(row[c.SLO])} ({md(row[c.ALERT])}): burning "
            f"{row[c.LONG_BURN_RATE]:,.1f}× over {window_label(row[c.LONG_WINDOW_S])} and "
            f"{row[c.SHORT_BURN_RATE]:,.1f}× over {window_label(row[c.SHORT_WINDOW_S])} "
            f"(fires at {row[c.FACTOR]:g}×) · firing since {utc(row[c.SINCE_NS])} UTC, "
            f"{span_text((row[c.TS_NS] - row[c.SINCE_NS]) / NS)} before the run's end")


def render(f: Filters, services: list[str], markers: Callable[[str], pl.DataFrame]) -> None:
    """The section for ``services`` (those on the page) and any with a stored SLO."""
    status = data.load("slo_status", f)
    rates, alerts = data.load("slo_burn_rates", f), data.load("slo_alerts", f)
    series = data.load("slo_budget_series", f)
    if status.height:
        st.caption(f"As analytics stored them at its latest run, over each SLO's compliance "
                   f"period ending {utc(status[c.TS_NS].max())} UTC (the time range picked "
                   "only limits the chart). Burn rate: error ratio / (1 − objective); 1 "
                   "spends the budget exactly over the period.")
    known = set(status[c.SERVICE_NAME].to_list())
    for i, service in enumerate(sorted(set(services) | known)):
        st.markdown(f"#### {md(service)}")
        if service not in known:
            st.info(CONFIGURE.format(service=md(service)), icon=":material/tune:")
            continue
        mine = status.filter(pl.col(c.SERVICE_NAME) == service)
        _service(i, mine, rates.filter(pl.col(c.SERVICE_NAME) == service),
                 alerts.filter(pl.col(c.SERVICE_NAME) == service),
                 series.filter(pl.col(c.SERVICE_NAME) == service), markers(service))


def _service(i: int, status: pl.DataFrame, rates: pl.DataFrame, alerts: pl.DataFrame,
             series: pl.DataFrame, markers: pl.DataFrame) -> None:
    for row in alerts.iter_rows(named=True):
        show = st.warning if row[c.SEVERITY] == "page" else st.info
        show(alert_text(row), icon=":material/notifications_active:")
    st.dataframe(status_table(status), hide_index=True, key=f"slo_status_{i}", column_config={
        "budget left": st.column_config.ProgressColumn(
            "budget left", min_value=0.0, max_value=1.0, format="percent", color="auto",
            help="Share of the period's error budget left (0 when exhausted)")})
    for row in status.filter(pl.col(c.BUDGET_REMAINING) <= 0).iter_rows(named=True):
        st.markdown(f":red[**Error budget exhausted: {md(row[c.SLO])}** — "
                    f"{row[c.BUDGET_CONSUMED]:.0%} of the budget of the last "
                    f"{period(row[c.PERIOD_S])} spent (target: {target(row)}).]")
    burns = burn_table(rates)
    if burns.height:
        st.caption("Burn rate per alert window ending at the run's end (empty: no events)")
        st.dataframe(burns, hide_index=True, key=f"slo_burn_{i}", column_config={
            col: st.column_config.NumberColumn(col, format="%.2f×")
            for col in burns.columns if col != c.SLO})
    if series.height:
        fig = ui.lines(ui.with_time(series, c.TS_NS), c.BUDGET_CONSUMED, c.SLO,
                       "Error budget spent since the period's start (100%: exhausted)")
        fig.add_hline(y=1.0, line={"color": "#d62728", "dash": "dash", "width": 1})
        fig.update_yaxes(tickformat=".0%", rangemode="tozero")
        st.plotly_chart(charts.add_markers(fig, markers), key=f"slo_budget_{i}")
