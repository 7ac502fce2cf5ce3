"""fleetlens' derived signals as a Prometheus endpoint, for the Grafana and alert rules users
already run.

Every scrape reads the latest *closed* window per (service, model, host) from ``windows`` (the
newest window of the data is still filling and is left out, as on the dashboard) and the open
incidents from ``incidents``/``causes``. Reads are cached for ``refresh_s`` so a fast scrape
interval does not rescan the tables. Values are the same numbers ``fleetlens sql`` shows; only
the names change (Prometheus base units: seconds, ratios 0..1, joules).

Exposed families (labels ``service``, ``model``, ``host``; ``host="*"`` is the fleet-wide row):

- ``fleetlens_requests_per_second``, ``fleetlens_error_ratio``
- ``fleetlens_{ttft,tpot,e2e}_seconds{quantile="0.5|0.9|0.99"}`` (window percentiles)
- ``fleetlens_energy_joules_per_token``, ``fleetlens_kv_cache_usage_ratio``
- ``fleetlens_window_end_timestamp_seconds`` (when the reported window closed)
- ``fleetlens_open_incidents{service, model, host, cause, severity}`` (top-ranked cause)
- per service and SLO: the error budget left, the burn rate per alert window, firing alerts
  and event counters (:mod:`analytics.slos.exporter`)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import polars as pl
from prometheus_client.core import GaugeMetricFamily, Metric

from fleetlens.analytics.slos.exporter import SloCounters, slo_families
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, has_parquet, retry_vanished, scan

NS = 1_000_000_000
LABELS = ("service", "model", "host")
#: window column -> (metric name, help)
SCALARS = {
    c.RPS: ("fleetlens_requests_per_second", "Requests per second in the latest closed window."),
    c.ERROR_RATE: ("fleetlens_error_ratio", "Share of requests that failed (0..1)."),
    c.J_PER_TOKEN: ("fleetlens_energy_joules_per_token", "GPU energy per output token, J."),
    c.KV_CACHE_USAGE_MEAN: ("fleetlens_kv_cache_usage_ratio", "Mean KV-cache usage (0..1)."),
}
#: latency metric -> help; each becomes fleetlens_<metric>_seconds{quantile}
LATENCIES = {
    "ttft": "Time to first token, window percentile.",
    "tpot": "Time per output token, window percentile.",
    "e2e": "End-to-end request latency, window percentile.",
}


def latest_closed_windows(root: DataDir) -> pl.DataFrame:
    """The latest closed window of each (service, model, host) series; empty without data."""
    if not has_parquet(root.table_dir(t.WINDOWS)):
        return pl.DataFrame()
    windows = retry_vanished(lambda: scan(root, t.WINDOWS).collect())
    if windows.is_empty():
        return windows
    newest = windows[c.WINDOW_START_NS].max()
    closed = windows.filter(pl.col(c.WINDOW_START_NS) < newest)  # the newest is still filling
    keys = [c.SERVICE_NAME, c.MODEL, c.HOST_NAME]
    return (closed.sort(c.WINDOW_START_NS)
            .group_by(keys, maintain_order=True).last()
            .sort(keys))


def open_incidents(root: DataDir, windows: pl.DataFrame) -> pl.DataFrame:
    """Incidents still open at the end of the latest closed window, with their top cause."""
    from fleetlens.analytics.runner import read_table

    incidents = read_table(root, t.INCIDENTS)
    if incidents.is_empty() or windows.is_empty():
        return incidents.head(0)
    now_ns = int((windows[c.WINDOW_START_NS] + windows[c.WINDOW_S] * NS).max())
    still_open = incidents.filter(pl.col(c.END_NS) >= now_ns)
    causes = read_table(root, t.CAUSES).filter(pl.col(c.RANK) == 1)
    return still_open.join(causes.select(c.INCIDENT_ID, c.CAUSE), on=c.INCIDENT_ID,
                           how="left").with_columns(pl.col(c.CAUSE).fill_null("unknown"))


@dataclass(eq=False)  # registries key collectors by identity
class DerivedSignals:
    """A prometheus_client collector over a data directory, re-read at most every
    ``refresh_s`` seconds (scrapes in between get the cached families)."""

    root: DataDir
    refresh_s: float = 15.0
    _cache: list[Metric] = field(default_factory=list)
    _read_at: float = float("-inf")
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _slo_counters: SloCounters = field(default_factory=SloCounters)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            if time.monotonic() - self._read_at >= self.refresh_s:
                self._cache = self.read()
                self._read_at = time.monotonic()
            yield from self._cache

    def read(self) -> list[Metric]:
        """Build every family from the tables now."""
        windows = latest_closed_windows(self.root)
        families: list[Metric] = []
        for column, (name, doc) in SCALARS.items():
            family = GaugeMetricFamily(name, doc, labels=LABELS)
            for row in windows.iter_rows(named=True) if column in windows.columns else ():
                if row[column] is not None:
                    family.add_metric(_labels(row), float(row[column]))
            families.append(family)
        for metric, doc in LATENCIES.items():
            family = GaugeMetricFamily(f"fleetlens_{metric}_seconds", doc,
                                       labels=(*LABELS, "quantile"))
            for suffix, quantile in c.PERCENTILES:
                column = c.percentile_column(metric, suffix)
                for row in windows.iter_rows(named=True) if column in windows.columns else ():
                    if row[column] is not None:
                        family.add_metric([*_labels(row), f"{quantile:g}"], float(row[column]))
            families.append(family)
        ended = GaugeMetricFamily("fleetlens_window_end_timestamp_seconds",
                                  "Unix time the reported window closed.", labels=LABELS)
        for row in windows.iter_rows(named=True):
            ended.add_metric(_labels(row), (row[c.WINDOW_START_NS] + row[c.WINDOW_S] * NS) / NS)
        families.append(ended)
        families.append(_incident_family(open_incidents(self.root, windows)))
        families += slo_families(self.root, self._slo_counters)
        return families


def _labels(row: dict) -> list[str]:
    return [str(row[c.SERVICE_NAME] or ""), str(row[c.MODEL] or ""), str(row[c.HOST_NAME] or "")]


def _incident_family(incidents: pl.DataFrame) -> GaugeMetricFamily:
    family = GaugeMetricFamily("fleetlens_open_incidents",
                               "Incidents open in the latest closed window, by top cause.",
                               labels=(*LABELS, "cause", "severity"))
    if incidents.is_empty():
        return family
    counts = incidents.group_by(c.SERVICE_NAME, c.MODEL, c.HOST_NAME, c.CAUSE,
                                c.SEVERITY).len().sort(pl.all().exclude("len"))
    for row in counts.iter_rows(named=True):
        family.add_metric([*_labels(row), str(row[c.CAUSE]), str(row[c.SEVERITY])],
                          float(row["len"]))
    return family
