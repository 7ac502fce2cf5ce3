"""The SLO families of ``fleetlens exporter`` (:mod:`analytics.exporter`), from the `slo_*`
tables the analytics run stored (nothing recomputed here):

- ``fleetlens_slo_objective_ratio{service, slo}``
- ``fleetlens_slo_error_budget_remaining_ratio{service, slo}`` (0..1, over the period)
- ``fleetlens_slo_burn_rate{service, slo, window}`` (``window``: ``5m``, ``1h``, ...)
- ``fleetlens_slo_alert_firing{service, slo, alert, severity}`` (1 per firing alert)
- ``fleetlens_slo_events_total`` and ``fleetlens_slo_bad_events_total{service, slo}``:
  counters of the events of every window that closed since the exporter started (a
  restart is a counter reset, which ``rate()`` handles); the generated Prometheus rules
  (:mod:`analytics.slos.rules`) compute their burn rates from these.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from fleetlens.analytics.slos.config import window_label
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir

LABELS = ("service", "slo")


@dataclass
class SloCounters:
    """Event counters accumulated over closed windows of `slo_windows`, read after read."""

    #: Start of the first window not yet counted (``None`` before the first read).
    watermark_ns: int | None = None
    events: dict[tuple[str, str], int] = field(default_factory=dict)
    bad: dict[tuple[str, str], int] = field(default_factory=dict)

    def update(self, windows: pl.DataFrame) -> None:
        """Count the windows that closed since the last read (the newest is still filling;
        the first read only sets the starting point: counters start at 0)."""
        if windows.is_empty():
            return
        newest = int(windows[c.WINDOW_START_NS].max())
        for key in windows.select(c.SERVICE_NAME, c.SLO).unique().iter_rows():
            self.events.setdefault(key, 0)
            self.bad.setdefault(key, 0)
        if self.watermark_ns is not None:
            new = windows.filter(pl.col(c.WINDOW_START_NS).is_between(
                self.watermark_ns, newest, closed="left"))
            sums = new.group_by(c.SERVICE_NAME, c.SLO).agg(pl.col(c.TOTAL_EVENTS).sum(),
                                                            pl.col(c.BAD_EVENTS).sum())
            for service, slo, total, bad in sums.iter_rows():
                self.events[(service, slo)] += int(total)
                self.bad[(service, slo)] += int(bad)
        self.watermark_ns = max(newest, self.watermark_ns or newest)


def slo_families(root: DataDir, counters: SloCounters) -> list[Metric]:
    """Every SLO family from the tables as the last analytics run left them."""
    from fleetlens.analytics.runner import read_table

    status = read_table(root, t.SLO_STATUS)
    objective = GaugeMetricFamily("fleetlens_slo_objective_ratio",
                                  "Share of events the SLO requires to be good.", labels=LABELS)
    remaining = GaugeMetricFamily(
        "fleetlens_slo_error_budget_remaining_ratio",
        "Share of the error budget of the compliance period left (0..1).", labels=LABELS)
    for row in status.iter_rows(named=True):
        key = [row[c.SERVICE_NAME], row[c.SLO]]
        objective.add_metric(key, row[c.OBJECTIVE])
        remaining.add_metric(key, row[c.BUDGET_REMAINING])
    burn = GaugeMetricFamily("fleetlens_slo_burn_rate",
                             "Error ratio over the window ending now / (1 - objective).",
                             labels=(*LABELS, "window"))
    for row in read_table(root, t.SLO_BURN_RATES).iter_rows(named=True):
        if row[c.BURN_RATE] is not None:  # no events in the window: no burn rate
            burn.add_metric([row[c.SERVICE_NAME], row[c.SLO], window_label(row[c.WINDOW_S])],
                            row[c.BURN_RATE])
    firing = GaugeMetricFamily("fleetlens_slo_alert_firing",
                               "1 for each burn-rate alert firing now.",
                               labels=(*LABELS, "alert", "severity"))
    for row in read_table(root, t.SLO_ALERTS).iter_rows(named=True):
        firing.add_metric([row[c.SERVICE_NAME], row[c.SLO], row[c.ALERT], row[c.SEVERITY]], 1)
    counters.update(read_table(root, t.SLO_WINDOWS))
    events = CounterMetricFamily("fleetlens_slo_events",
                                 "Events the SLO judged, in windows closed since start.",
                                 labels=LABELS)
    bad = CounterMetricFamily("fleetlens_slo_bad_events",
                              "Bad events (failed, or over the latency threshold).",
                              labels=LABELS)
    for key in sorted(counters.events):
        events.add_metric(list(key), counters.events[key])
        bad.add_metric(list(key), counters.bad[key])
    return [objective, remaining, burn, firing, events, bad]


__all__ = ["SloCounters", "slo_families"]
