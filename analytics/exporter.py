"""fleetlens' derived signals as a Prometheus endpoint, in Prometheus' own conventions, for
the Grafana dashboards and alert rules users already run (deploy/grafana/, deploy/prometheus/).

Each read takes the stored tables as the last pipeline and analytics runs left them; reads
are cached for ``refresh_s`` so a fast scrape interval does not rescan the tables. History is
Prometheus' job: the exporter serves the state now, and counters that Prometheus turns into
rates. Names live in :mod:`pipeline.schema.exported`; labels ``service``, ``model``, ``host``;
no family holds a fleet-wide row beside the per-host rows it sums, so ``sum by`` is right.

- counters ``fleetlens_requests_total``, ``fleetlens_request_errors_total``,
  ``fleetlens_{input,output}_tokens_total``, ``fleetlens_gpu_energy_joules_total`` and the
  histograms ``fleetlens_{ttft,tpot,e2e}_seconds`` over the windows closed since the exporter
  started (:mod:`analytics.exporter_counters`);
- gauges of the latest closed window: ``fleetlens_energy_joules_per_token``,
  ``fleetlens_kv_cache_usage_ratio``, ``fleetlens_window_end_timestamp_seconds``, and the
  baselines ``fleetlens_baseline_{expected,lower,upper}{metric}``
  (:mod:`analytics.exporter_gauges`);
- ``fleetlens_open_incidents{cause}`` (0 when none), ``fleetlens_incident_info`` (1 per
  active incident) and each active incident's stored phase split,
  ``fleetlens_incident_phase_{excess_seconds,share_ratio}{incident_id, phase}``
  (:mod:`analytics.exporter_incidents`);
- per service and SLO: the error budget left, the burn rate per alert window, firing alerts
  and event counters (:mod:`analytics.slos.exporter`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.core import Metric

from fleetlens.analytics.capacity.exporter import capacity_families
from fleetlens.analytics.exporter_counters import RequestCounters, per_host
from fleetlens.analytics.exporter_gauges import (
    DEFAULT_LOOKBACK_S,
    baseline_families,
    latest_closed,
    recent_windows,
    window_families,
)
from fleetlens.analytics.exporter_incidents import (
    incident_families,
    open_incidents,
    phase_families,
)
from fleetlens.analytics.open_incidents import closed_until_ns
from fleetlens.analytics.slos.exporter import SloCounters, slo_families
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.storage import DataDir


@dataclass(eq=False)  # registries key collectors by identity
class DerivedSignals:
    """A prometheus_client collector over a data directory, re-read at most every
    ``refresh_s`` seconds (scrapes in between get the cached families).

    ``dashboard_url`` (``[analytics] dashboard_url``) makes each incident's info series carry
    the link to its page on the dashboard, as the webhooks do. ``lookback_s``: a read takes
    the windows and baselines of that long before the newest window (and the windows not yet
    counted); a series silent longer is no longer served.
    """

    root: DataDir
    refresh_s: float = 15.0
    dashboard_url: str | None = None
    lookback_s: float = DEFAULT_LOOKBACK_S
    _cache: list[Metric] = field(default_factory=list)
    _read_at: float = float("-inf")
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _counters: RequestCounters = field(default_factory=RequestCounters)
    _slo_counters: SloCounters = field(default_factory=SloCounters)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            if time.monotonic() - self._read_at >= self.refresh_s:
                self._cache = self.read()
                self._read_at = time.monotonic()
            yield from self._cache

    def read(self) -> list[Metric]:
        """Build every family from the tables now."""
        windows = per_host(recent_windows(self.root, self.lookback_s,
                                          since_ns=self._counters.watermark_ns))
        self._counters.update(self.root, windows, idle_s=self.lookback_s)
        latest = latest_closed(windows, self.lookback_s)
        closed_start = None if latest.is_empty() else int(latest[c.WINDOW_START_NS].max())
        # active: the dashboard's definition (analytics.open_incidents), at the same "now"
        now_ns = None if windows.is_empty() else closed_until_ns(windows)
        active = open_incidents(self.root, now_ns)
        return [*self._counters.families(), *window_families(latest),
                *baseline_families(self.root, closed_start, self.lookback_s),
                *incident_families(active, self.dashboard_url),
                *phase_families(self.root, active),
                *slo_families(self.root, self._slo_counters),
                *capacity_families(self.root)]


__all__ = ["DerivedSignals"]
