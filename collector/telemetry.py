"""Self-telemetry: counters shared by all worker processes, in Prometheus text format.

Every worker owns one row of a shared ``multiprocessing`` array of doubles, so ``/metrics``
on any worker (the HTTP port is shared with SO_REUSEPORT) reports the whole collector.
"""

from __future__ import annotations

import bisect
import logging
import multiprocessing
import threading
from typing import Any

log = logging.getLogger("fleetlens.collector")

PREFIX = "fleetlens_collector_"
#: name -> (Prometheus type, help). Counter names get ``_total`` in the output.
SERIES: dict[str, tuple[str, str]] = {
    "received_spans": ("counter", "Spans accepted and made durable."),
    "received_data_points": ("counter", "Metric data points accepted and made durable."),
    "received_log_records": ("counter", "Log records accepted and made durable."),
    "rejected_items": ("counter", "Spans, points and log records rejected by validation."),
    "invalid_requests": ("counter", "Requests refused as undecodable (INVALID_ARGUMENT/400)."),
    "unauthenticated_requests": ("counter", "Requests refused for a missing or wrong token."),
    "oversize_requests": ("counter", "Requests refused as too large (RESOURCE_EXHAUSTED/413)."),
    "refused_requests": ("counter", "Requests refused by backpressure (UNAVAILABLE/503)."),
    "storage_failures": ("counter", "Requests refused because the WAL failed (UNAVAILABLE)."),
    "truncated_values": ("counter", "Attribute values cut or maps shortened by the limits."),
    "overflow_names": ("counter", "Service/host/model names sent to the overflow bucket."),
    "unknown_field_requests": ("counter", "Requests whose unknown protobuf fields were "
                               "dropped before the WAL."),
    "balanced_exports": ("counter", "Exports this worker handed to a worker running fewer "
                         "(their items are counted there)."),
    "flushed_rows": ("counter", "Rows published in Parquet segments."),
    "flushed_segments": ("counter", "Parquet segments published."),
    "flush_failures": ("counter", "Parquet publish attempts that failed (retried)."),
    "wal_bytes": ("counter", "Bytes appended to the write-ahead log."),
    "wal_fsyncs": ("counter", "fdatasync calls on the write-ahead log (group commits)."),
    "wal_replayed_records": ("counter", "WAL records replayed at start-up."),
    "wal_torn_tails": ("counter", "WAL files that ended in a torn frame (a write cut short) "
                       "at replay or forwarding."),
    "queue_bytes": ("gauge", "Bytes buffered and not yet published."),
    "refused_spans": ("counter", "Spans of requests refused whole or in part (partial success)."),
    "refused_data_points": ("counter", "Metric data points of requests refused whole or in "
                            "part."),
    "refused_log_records": ("counter", "Log records of requests refused whole or in part."),
    "forwarded_requests": ("counter", "Edge mode: Export requests the central collector "
                           "acknowledged."),
    "forwarded_bytes": ("counter", "Edge mode: request bytes the central collector "
                        "acknowledged."),
    "forward_failures": ("counter", "Edge mode: forwarding attempts that failed (retried)."),
    "forward_dropped_requests": ("counter", "Edge mode: requests the central collector "
                                 "refused as permanently invalid (kept in wal/.quarantine)."),
    "forward_pending_bytes": ("gauge", "Edge mode: WAL bytes not yet forwarded."),
    "forward_central_unhealthy": ("gauge", "Edge mode: workers that stopped forwarding "
                                  "after forward.max_refused_in_a_row permanent refusals in "
                                  "a row (0 when healthy)."),
    "export_seconds_sum": ("counter", "Total time spent in Export calls."),
    "export_seconds_count": ("counter", "Export calls answered."),
}
#: OpenTelemetry Collector internal metric names (``receiver="otlp"``, ``transport`` grpc or
#: http) -> our series.
OTELCOL_RECEIVER: dict[str, tuple[str, str]] = {
    "otelcol_receiver_accepted_spans": ("received_spans", "Spans accepted and made durable."),
    "otelcol_receiver_refused_spans": ("refused_spans", "Spans refused."),
    "otelcol_receiver_accepted_metric_points": ("received_data_points",
                                                "Metric data points accepted and made durable."),
    "otelcol_receiver_refused_metric_points": ("refused_data_points",
                                               "Metric data points refused."),
    "otelcol_receiver_accepted_log_records": ("received_log_records",
                                              "Log records accepted and made durable."),
    "otelcol_receiver_refused_log_records": ("refused_log_records", "Log records refused."),
}
#: Accepted-items series -> its refused-items series (per signal).
REFUSED_OF = {"received_spans": "refused_spans", "received_data_points": "refused_data_points",
              "received_log_records": "refused_log_records"}
#: The receivers, as the ``transport`` label names them.
TRANSPORTS = ("grpc", "http")
#: ``<series>@<transport>`` item counters behind the ``transport`` label of the otelcol_*
#: series (kept out of the ``fleetlens_collector_*`` output, which sums the transports).
_SPLIT = [f"{series}@{transport}" for series, _ in OTELCOL_RECEIVER.values()
          for transport in TRANSPORTS]
LATENCY_BOUNDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_NAMES = list(SERIES) + _SPLIT
_WIDTH = len(_NAMES) + len(LATENCY_BOUNDS) + 1


def shared_array(workers: int) -> Any:
    """A zeroed shared array with one row per worker (create before starting workers)."""
    return multiprocessing.get_context("spawn").RawArray("d", workers * _WIDTH)


class Telemetry:
    """The counters of one worker, a row of the shared array."""

    def __init__(self, array: Any | None = None, slot: int = 0) -> None:
        self.array = array if array is not None else shared_array(1)
        self.base = slot * _WIDTH
        self.workers = len(self.array) // _WIDTH
        self._lock = threading.Lock()  # += on shared memory is not atomic across threads

    def add(self, name: str, amount: float = 1.0) -> None:
        """Add to a counter of this worker (one process writes each slot)."""
        with self._lock:
            self.array[self.base + _NAMES.index(name)] += amount

    def set(self, name: str, value: float) -> None:
        """Set a gauge of this worker."""
        self.array[self.base + _NAMES.index(name)] = value

    def observe_export(self, seconds: float) -> None:
        """Record one Export latency in the histogram."""
        self.add("export_seconds_sum", seconds)
        self.add("export_seconds_count")
        bucket = bisect.bisect_left(LATENCY_BOUNDS, seconds)
        with self._lock:
            self.array[self.base + len(_NAMES) + bucket] += 1

    def total(self, name: str) -> float:
        """A series summed over all workers."""
        index = _NAMES.index(name)
        return sum(self.array[w * _WIDTH + index] for w in range(self.workers))

    def prometheus(self) -> str:
        """All series, summed over workers, in Prometheus text exposition format."""
        lines = []
        for name, (kind, text) in SERIES.items():
            if name.startswith("export_seconds"):
                continue
            metric = PREFIX + name + ("_total" if kind == "counter" else "")
            lines += [f"# HELP {metric} {text}", f"# TYPE {metric} {kind}",
                      f"{metric} {self.total(name):.17g}"]
        metric = PREFIX + "export_seconds"
        lines += [f"# HELP {metric} Export latency.", f"# TYPE {metric} histogram"]
        cumulative = 0.0
        for i, bound in enumerate((*LATENCY_BOUNDS, float("inf"))):
            cumulative += sum(self.array[w * _WIDTH + len(_NAMES) + i]
                              for w in range(self.workers))
            label = "+Inf" if bound == float("inf") else f"{bound:g}"
            lines.append(f'{metric}_bucket{{le="{label}"}} {cumulative:.17g}')
        lines += [f"{metric}_sum {self.total('export_seconds_sum'):.17g}",
                  f"{metric}_count {self.total('export_seconds_count'):.17g}"]
        return "\n".join(lines) + "\n"

    def add_items(self, series: str, transport: str, amount: float) -> None:
        """Add items to a per-signal series and to its share of ``transport``."""
        self.add(series, amount)
        if transport in TRANSPORTS:
            self.add(f"{series}@{transport}", amount)

    def otelcol(self) -> str:
        """The receiver counters under the OTel Collector's own names, summed over workers."""
        lines = []
        for name, (series, text) in OTELCOL_RECEIVER.items():
            lines += [f"# HELP {name} {text}", f"# TYPE {name} counter"]
            lines += [f'{name}_total{{receiver="otlp",transport="{transport}"}} '
                      f'{self.total(f"{series}@{transport}"):.17g}' for transport in TRANSPORTS]
        return "\n".join(lines) + "\n"

    def summary(self) -> str:
        """One log line with the main counters."""
        keys = ("received_spans", "received_data_points", "received_log_records",
                "rejected_items", "refused_requests", "flushed_rows", "queue_bytes")
        count = self.total("export_seconds_count")
        mean_ms = 1000 * self.total("export_seconds_sum") / count if count else 0.0
        return " ".join(f"{k}={self.total(k):.0f}" for k in keys) + f" export_mean_ms={mean_ms:.1f}"
