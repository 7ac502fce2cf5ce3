"""Good and bad events of each configured SLO per window, from `requests`.

- availability: every request of the service is an event; a bad one failed (``is_error``).
- latency: every request of the service that succeeded and has the metric (TPOT needs two
  output tokens) is an event; a bad one's metric is above the threshold. Failed requests are
  the availability SLO's to count, not charged twice.

Windows are the pipeline's (``window_s``), aligned to the epoch like `windows` rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from fleetlens.analytics.slos.config import AVAILABILITY, LATENCY, ServiceSlos, SloConfig
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

NS = 1_000_000_000
#: latency SLO metric -> its `requests` column
METRIC_COLUMNS = {"ttft": c.TTFT_S, "e2e": c.E2E_S, "tpot": c.TPOT_S, "queue": c.QUEUE_S}


@dataclass(frozen=True)
class Sli:
    """One SLO of one service, flattened from the configuration."""

    service: str
    name: str
    kind: str
    objective: float
    metric: str | None = None
    threshold_s: float | None = None

    @property
    def budget(self) -> float:
        """The share of events allowed to be bad: 1 - objective."""
        return 1.0 - self.objective


def slis(config: SloConfig) -> list[Sli]:
    """Every configured SLO, service by service (availability first)."""
    return [sli for service in config.services for sli in _of(service)]


def _of(service: ServiceSlos) -> list[Sli]:
    found = []
    if service.availability is not None:
        found.append(Sli(service.service, AVAILABILITY, AVAILABILITY, service.availability))
    for slo in service.latency:
        found.append(Sli(service.service, slo.slo_name(), LATENCY, slo.objective, slo.metric,
                         slo.threshold_s))
    return found


def _judged(sli: Sli) -> tuple[pl.Expr, pl.Expr]:
    """(which requests are events, which events are bad) for one SLO."""
    failed = pl.col(c.IS_ERROR).fill_null(False)
    if sli.kind == AVAILABILITY:
        return pl.lit(True), failed
    value = pl.col(METRIC_COLUMNS[sli.metric or ""])
    return value.is_not_null() & ~failed, value > (sli.threshold_s or 0.0)


def window_events(requests: pl.LazyFrame, config: SloConfig, window_s: int, start_ns: int,
                  end_ns: int) -> pl.DataFrame:
    """Events and bad events per (service, SLO, window) of requests arriving in
    [start_ns, end_ns): the `slo_windows` table (windows without events have no row).

    Args:
        requests: the `requests` table (only service, arrival, is_error and the latency
            columns the SLOs judge are read).
        config: the SLOs.
        window_s: the window size, s.
        start_ns, end_ns: the arrivals counted.
    """
    step = window_s * NS
    parts = []
    for sli in slis(config):
        event, bad = _judged(sli)
        parts.append(
            requests.filter((pl.col(c.SERVICE_NAME) == sli.service)
                            & pl.col(c.ARRIVAL_NS).is_between(start_ns, end_ns, closed="left"))
            .filter(event)
            .group_by((pl.col(c.ARRIVAL_NS) - pl.col(c.ARRIVAL_NS) % step)
                      .alias(c.WINDOW_START_NS))
            .agg(pl.len().cast(pl.Int64).alias(c.TOTAL_EVENTS),
                 bad.sum().cast(pl.Int64).alias(c.BAD_EVENTS))
            .with_columns(pl.lit(window_s, pl.Int64).alias(c.WINDOW_S),
                          pl.lit(sli.service).alias(c.SERVICE_NAME),
                          pl.lit(sli.name).alias(c.SLO)))
    empty = t.table(t.SLO_WINDOWS).empty()
    if not parts:
        return empty
    frame = pl.concat([p.select(empty.columns) for p in parts]).collect()
    return frame.sort(c.SERVICE_NAME, c.SLO, c.WINDOW_START_NS)


def now_of(requests: pl.LazyFrame, window_s: int) -> int | None:
    """The end of the window holding the newest arrival (``None`` without requests)."""
    last = requests.select(pl.col(c.ARRIVAL_NS).max()).collect().item()
    if last is None:
        return None
    step = window_s * NS
    return int(last) - int(last) % step + step


__all__ = ["METRIC_COLUMNS", "Sli", "now_of", "slis", "window_events"]
