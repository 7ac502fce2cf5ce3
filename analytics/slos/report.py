"""One SLO pass over a data directory's `requests`: the four `slo_*` tables and the firing
alerts as rows the webhooks post (:func:`alert_rows`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from fleetlens.analytics.slos.burn import evaluate
from fleetlens.analytics.slos.config import SloConfig
from fleetlens.analytics.slos.events import now_of, window_events
from fleetlens.analytics.webhook_formats import SLO_DETECTOR
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

NS = 1_000_000_000
_ANY = "*"


def _empty(table: str) -> pl.DataFrame:
    return t.table(table).empty()


@dataclass
class SloReport:
    """The SLO tables of one analytics run (empty without SLOs or requests)."""

    now_ns: int | None = None
    windows: pl.DataFrame = field(default_factory=lambda: _empty(t.SLO_WINDOWS))
    status: pl.DataFrame = field(default_factory=lambda: _empty(t.SLO_STATUS))
    burn_rates: pl.DataFrame = field(default_factory=lambda: _empty(t.SLO_BURN_RATES))
    alerts: pl.DataFrame = field(default_factory=lambda: _empty(t.SLO_ALERTS))

    def tables(self) -> dict[str, tuple[pl.DataFrame, str]]:
        """table -> (frame, its timestamp column), as :func:`analytics.runner.publish` takes."""
        return {t.SLO_WINDOWS: (self.windows, c.WINDOW_START_NS),
                t.SLO_STATUS: (self.status, c.TS_NS),
                t.SLO_BURN_RATES: (self.burn_rates, c.TS_NS),
                t.SLO_ALERTS: (self.alerts, c.TS_NS)}


def slo_report(requests: pl.LazyFrame | None, config: SloConfig, window_s: int,
               now_ns: int | None = None) -> SloReport:
    """Evaluate every configured SLO over the compliance period ending ``now_ns`` (default:
    the end of the window of the newest request).

    Reads only the columns the SLOs judge, over the compliance period (not the run's
    ``history_s``: a 30-day budget needs 30 days of requests, as far as retention keeps them).
    """
    if not config.services or requests is None:
        return SloReport()
    now_ns = now_ns if now_ns is not None else now_of(requests, window_s)
    if now_ns is None:
        return SloReport()
    start_ns = now_ns - config.period_s * NS
    events = window_events(requests, config, window_s, start_ns, now_ns)
    status, rates, alerts = evaluate(events, config, window_s, now_ns)
    return SloReport(now_ns, events, status, rates, alerts)


def alert_rows(report: SloReport) -> list[dict[str, Any]]:
    """Each firing alert as an incident-shaped row for :func:`analytics.webhook.notify_new`:
    its id, the SLO as the metric, since when it fires, the long window's burn rate against
    the factor as peak against expected, and the SLO's details (budget left, both burns)."""
    budget = {(r[c.SERVICE_NAME], r[c.SLO]): r[c.BUDGET_REMAINING]
              for r in report.status.iter_rows(named=True)}
    rows = []
    for alert in report.alerts.iter_rows(named=True):
        row = {
            c.INCIDENT_ID: alert[c.ALERT_ID], c.METRIC: alert[c.SLO],
            c.SERVICE_NAME: alert[c.SERVICE_NAME], c.MODEL: _ANY, c.HOST_NAME: _ANY,
            c.START_NS: alert[c.SINCE_NS], c.END_NS: alert[c.TS_NS],
            c.PEAK: alert[c.LONG_BURN_RATE], c.EXPECTED: alert[c.FACTOR],
            c.SEVERITY: alert[c.SEVERITY], c.DETECTOR: SLO_DETECTOR,
        }
        row.update({k: alert[k] for k in (c.SLO, c.ALERT, c.FACTOR, c.LONG_WINDOW_S,
                                           c.SHORT_WINDOW_S, c.LONG_BURN_RATE,
                                           c.SHORT_BURN_RATE, c.OBJECTIVE)})
        row[c.BUDGET_REMAINING] = budget.get((alert[c.SERVICE_NAME], alert[c.SLO]))
        rows.append(row)
    return rows


__all__ = ["SloReport", "alert_rows", "slo_report"]
