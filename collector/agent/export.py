"""OTLP export through the OpenTelemetry SDK: instruments, collection and batched shipping.

Each signal group (GPU, engine) has its own ``MeterProvider`` with an ``InMemoryMetricReader``.
The group's loop stores its latest samples and calls :meth:`MetricGroup.collect`, which runs
the observable instruments' callbacks once: one point per series per sample, stamped with
the collection time. Collections queue in an :class:`Outbox` whose thread merges them into
one OTLP request per ``export_interval_s`` (so 10 Hz GPU sampling costs one RPC a second), and
keeps them, bounded, while the collector is unreachable.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    Gauge,
    InMemoryMetricReader,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource

log = logging.getLogger(__name__)

#: (value, attributes) pairs a callback yields.
Points = Iterable[tuple[float | int, dict[str, str | int]]]


class MetricGroup:
    """A meter provider whose instruments are read only when :meth:`collect` is called."""

    def __init__(self, resource: Resource, scope: str) -> None:
        self._reader = InMemoryMetricReader()
        self._provider = MeterProvider(resource=resource, metric_readers=[self._reader])
        self.meter = self._provider.get_meter(scope)

    def gauge(self, name: str, unit: str, description: str,
              points: Callable[[], Points]) -> None:
        """An observable gauge fed by ``points()`` at each collection."""
        self.meter.create_observable_gauge(name, [_callback(points)], unit, description)

    def counter(self, name: str, unit: str, description: str,
                points: Callable[[], Points]) -> None:
        """An observable (cumulative, monotonic) counter fed by ``points()``."""
        self.meter.create_observable_counter(name, [_callback(points)], unit, description)

    def up_down_counter(self, name: str, unit: str, description: str,
                        points: Callable[[], Points]) -> None:
        """An observable up-down counter (a cumulative, non-monotonic sum) fed by ``points()``:
        the conventions' instrument for amounts that go up and down, e.g. memory used."""
        self.meter.create_observable_up_down_counter(name, [_callback(points)], unit,
                                                     description)

    def collect(self) -> MetricsData | None:
        """Run every callback once; ``None`` when nothing was observed."""
        data = self._reader.get_metrics_data()
        if data is None or not any(sm.metrics for rm in data.resource_metrics
                                   for sm in rm.scope_metrics):
            return None
        return data

    def shutdown(self) -> None:
        self._provider.shutdown()


def _callback(points: Callable[[], Points]):
    def observe(options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(value, attrs) for value, attrs in points()]
    return observe


def merge(batch: list[MetricsData]) -> MetricsData:
    """Merge collections into one ``MetricsData``: one resource/scope entry, and each metric
    with the data points of every collection (the OTLP encoder keeps only the last entry of
    a repeated resource, so collections cannot simply be concatenated)."""
    resources: dict[Resource, dict[object, dict[str, list[Metric]]]] = {}
    for data in batch:
        for rm in data.resource_metrics:
            scopes = resources.setdefault(rm.resource, {})
            for sm in rm.scope_metrics:
                metrics = scopes.setdefault(sm.scope, {})
                for metric in sm.metrics:
                    metrics.setdefault(metric.name, []).append(metric)
    return MetricsData(resource_metrics=[
        ResourceMetrics(resource=resource, schema_url="", scope_metrics=[
            ScopeMetrics(scope=scope, schema_url="",
                         metrics=[_merge_metric(parts) for parts in metrics.values()])
            for scope, metrics in scopes.items()
        ])
        for resource, scopes in resources.items()
    ])


def _merge_metric(parts: list[Metric]) -> Metric:
    first = parts[0]
    points = [p for m in parts for p in m.data.data_points]
    if isinstance(first.data, Sum):
        data = Sum(data_points=points, aggregation_temporality=first.data.aggregation_temporality,
                   is_monotonic=first.data.is_monotonic)
    else:
        data = Gauge(data_points=points)
    return Metric(name=first.name, description=first.description, unit=first.unit, data=data)


#: Collections per OTLP request: a backlog goes out in pieces a standard OTLP receiver takes
#: (its default limit is 4 MiB; 50 collections of 8 GPUs encode to about 0.6 MiB).
MAX_BATCH = 50
#: Seconds between repeated warnings while collections are being dropped.
DROP_WARNING_EVERY_S = 30.0


class Outbox:
    """Bounded queue of collections, shipped by a background thread every ``interval_s``."""

    def __init__(self, exporter: MetricExporter, interval_s: float, max_pending: int,
                 timeout_s: float, name: str) -> None:
        self.exporter = exporter
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.name = name
        self._pending: deque[MetricsData] = deque()
        self._max = max_pending
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"export-{name}", daemon=True)
        self._failing = False
        self._warned_at = float("-inf")
        self.dropped = 0
        self.exported_batches = 0

    def put(self, data: MetricsData | None) -> None:
        """Queue one collection; beyond the bound the oldest is dropped (counted, logged)."""
        if data is None:
            return
        with self._lock:
            self._pending.append(data)
            self._trim()

    def _trim(self) -> None:
        """Drop the oldest collections beyond the bound (the caller holds the lock)."""
        over = len(self._pending) - self._max
        if over <= 0:
            return
        for _ in range(over):
            self._pending.popleft()
        self.dropped += over
        now = time.monotonic()
        if now - self._warned_at >= DROP_WARNING_EVERY_S:
            self._warned_at = now
            log.warning("%s: the collector has been unreachable for longer than the buffer "
                        "holds (max_pending_collections=%d): %d collections dropped so far, "
                        "oldest first", self.name, self._max, self.dropped)

    def start(self) -> None:
        self._thread.start()

    def flush(self) -> bool:
        """Ship everything queued now, :data:`MAX_BATCH` collections per request; on a
        failure put the unsent ones back. Returns whether everything went out."""
        while True:
            with self._lock:
                batch = [self._pending.popleft()
                         for _ in range(min(MAX_BATCH, len(self._pending)))]
            if not batch:
                return True
            result = self.exporter.export(merge(batch), timeout_millis=self.timeout_s * 1000)
            if result is not MetricExportResult.SUCCESS:
                break
            self.exported_batches += 1
            if self._failing:
                log.warning("%s: collector reachable again", self.name)
                self._failing = False
        if not self._failing:
            log.warning("%s: export to the collector failed; keeping the collections",
                        self.name)
            self._failing = True
        with self._lock:
            for data in reversed(batch):
                self._pending.appendleft(data)
            self._trim()
        return False

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.flush()

    def begin_stop(self) -> None:
        """Ask the export thread to end (several outboxes then stop side by side)."""
        self._stop.set()

    def stop(self) -> int:
        """Stop the thread after one last flush; returns how many collections were not
        delivered (logged as an error)."""
        self.begin_stop()
        if self._thread.is_alive():
            self._thread.join()
        # The collector just failed: one more full timeout would only delay the exit.
        if not self._failing:
            self.flush()
        with self._lock:
            left = len(self._pending)
        if left:
            log.error("%s: %d collections not delivered at shutdown: the collector is "
                      "unreachable", self.name, left)
        self.exporter.shutdown()
        return left
