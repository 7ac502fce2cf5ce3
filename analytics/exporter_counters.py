"""The exporter's counters and latency histograms (:mod:`analytics.exporter`), per service,
model and host, over the requests of the windows that closed since the exporter started.

A counter must only go up, and what came before the exporter started is not a rate Prometheus
saw, so every series starts at 0 (a restart is a counter reset, which ``rate()`` handles), and
each read adds the requests whose window closed since the read before: arrived at or after
the *watermark* (the start of the first window not yet counted) and before the start of the
newest window, which is still filling. A request is in the window of its arrival, as in
``windows`` (pipeline.windows), so ``increase(fleetlens_requests_total[1h])`` is the sum of
the hour's ``requests`` column. Requests stored late for a window already counted are not
counted (the dashboard and ``fleetlens sql`` have them).

A series with no window for longer than the exporter's lookback is dropped (Prometheus marks
it stale; should it come back, it starts again at 0, a reset ``rate()`` handles), so the
families hold the series of the last hour, not every series ever seen.

The histograms count each request's TTFT, TPOT and end-to-end latency into the fixed buckets
of :data:`pipeline.schema.exported.BUCKETS`; a request without a value (a failure before its
first token has no TTFT) is in none, so a histogram's ``_count`` may be below the requests'.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from fleetlens.pipeline.partitions import files_since
from fleetlens.pipeline.schema import FLEET_WIDE
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import exported as x
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, polars_options, retry_vanished

Key = tuple[str, str, str]
KEYS = (c.SERVICE_NAME, c.MODEL, c.HOST_NAME)
#: histogram metric -> the ``requests`` column it counts
LATENCY_COLUMNS = {"ttft": c.TTFT_S, "tpot": c.TPOT_S, "e2e": c.E2E_S}
#: counter family -> (help, the per-key aggregate it adds)
COUNTERS = {
    x.REQUESTS: ("Requests that arrived in windows closed since the exporter started.",
                 pl.len()),
    x.REQUEST_ERRORS: ("Of those, the requests that failed.", pl.col(c.IS_ERROR).sum()),
    x.INPUT_TOKENS: ("Prompt tokens of those requests.", pl.col(c.INPUT_TOKENS).sum()),
    x.OUTPUT_TOKENS: ("Output tokens of those requests.", pl.col(c.OUTPUT_TOKENS).sum()),
}
ENERGY_HELP = "GPU energy of the host's windows closed since the exporter started, J."


@dataclass
class Histogram:
    """Cumulative bucket counts (one per boundary), the sum and the count of observations."""

    buckets: list[int]
    total: float = 0.0
    count: int = 0


@dataclass
class RequestCounters:
    """Counters and histograms accumulated read after read (see the module docstring)."""

    watermark_ns: int | None = None
    counters: dict[str, dict[Key, float]] = field(default_factory=dict)
    histograms: dict[str, dict[Key, Histogram]] = field(default_factory=dict)
    #: start of each series' newest window seen (to drop the series silent too long)
    last_seen_ns: dict[Key, int] = field(default_factory=dict)

    def update(self, root: DataDir, windows: pl.DataFrame, idle_s: float = 3600.0) -> None:
        """Count what closed since the last read; ``windows``: the per-host rows of the
        stored windows, every one from :attr:`watermark_ns` on (the first read only sets the
        starting point and the series at 0). Series without a window in the ``idle_s``
        before the newest are dropped."""
        if windows.is_empty():
            return
        newest = int(windows[c.WINDOW_START_NS].max())
        seen = windows.group_by(KEYS).agg(pl.col(c.WINDOW_START_NS).max())
        for *key, start in seen.iter_rows():
            self._series(_key(key))
            self.last_seen_ns[_key(key)] = max(start, self.last_seen_ns.get(_key(key), start))
        if self.watermark_ns is not None and newest > self.watermark_ns:
            since = self.watermark_ns
            self._add_requests(retry_vanished(lambda: _requests_between(root, since, newest)))
            size = windows[c.WINDOW_S].min()  # one window size, or energy counts twice
            closed = windows.filter(pl.col(c.WINDOW_S) == size, pl.col(
                c.WINDOW_START_NS).is_between(since, newest, closed="left"))
            energy = closed.group_by(KEYS).agg(pl.col(c.ENERGY_J).sum())
            for *key, joules in energy.iter_rows():
                self._series(_key(key))
                self.counters[x.GPU_ENERGY][_key(key)] += float(joules or 0.0)
        self.watermark_ns = max(newest, self.watermark_ns or newest)
        self._retire(newest - int(idle_s * 1e9))

    def _retire(self, before_ns: int) -> None:
        for key in [k for k, seen in self.last_seen_ns.items() if seen < before_ns]:
            del self.last_seen_ns[key]
            for series in (*self.counters.values(), *self.histograms.values()):
                series.pop(key, None)

    def _series(self, key: Key) -> None:
        for name in (*COUNTERS, x.GPU_ENERGY):
            self.counters.setdefault(name, {}).setdefault(key, 0.0)
        for metric in LATENCY_COLUMNS:
            self.histograms.setdefault(metric, {}).setdefault(
                key, Histogram([0] * len(x.BUCKETS[metric])))

    def _add_requests(self, requests: pl.DataFrame) -> None:
        if requests.is_empty():
            return
        aggs = [expr.alias(name) for name, (_, expr) in COUNTERS.items()]
        for metric, col in LATENCY_COLUMNS.items():
            value = pl.when(pl.col(col).is_finite()).then(pl.col(col))
            aggs += [(value <= le).sum().alias(f"{metric}:{i}")
                     for i, le in enumerate(x.BUCKETS[metric])]
            aggs += [value.sum().alias(f"{metric}:sum"), value.count().alias(f"{metric}:n")]
        sums = requests.with_columns(pl.col(c.HOST_NAME).fill_null("")).group_by(KEYS).agg(aggs)
        for row in sums.iter_rows(named=True):
            key = _key(tuple(row[k] for k in KEYS))
            self._series(key)
            for name in COUNTERS:
                self.counters[name][key] += float(row[name] or 0)
            for metric in LATENCY_COLUMNS:
                hist = self.histograms[metric][key]
                for i in range(len(hist.buckets)):
                    hist.buckets[i] += int(row[f"{metric}:{i}"])
                hist.total += float(row[f"{metric}:sum"] or 0.0)
                hist.count += int(row[f"{metric}:n"])

    def families(self) -> list[Metric]:
        """The counter and histogram families as they stand."""
        families: list[Metric] = []
        for name, (doc, _) in {**COUNTERS, x.GPU_ENERGY: (ENERGY_HELP, None)}.items():
            family = CounterMetricFamily(name, doc, labels=x.SCOPE)
            for key, value in sorted(self.counters.get(name, {}).items()):
                family.add_metric(list(key), value)
            families.append(family)
        for metric, name in x.LATENCY_HISTOGRAMS.items():
            family = HistogramMetricFamily(
                name, f"{metric.upper()} of the requests counted in {x.REQUESTS}_total, s.",
                labels=x.SCOPE)
            for key, hist in sorted(self.histograms.get(metric, {}).items()):
                # le as prometheus_client (so vLLM) writes it, "1.0": sum by (le) groups strings
                buckets = [(floatToGoString(le), n)
                           for le, n in zip(x.BUCKETS[metric], hist.buckets, strict=True)]
                family.add_metric(list(key), [*buckets, ("+Inf", hist.count)], hist.total)
            families.append(family)
        return families


def _requests_between(root: DataDir, lo_ns: int, hi_ns: int) -> pl.DataFrame:
    """The stored requests that arrived in ``[lo_ns, hi_ns)``, read from the partitions that
    can hold them only."""
    files = [str(f) for f in files_since(root, t.REQUESTS, lo_ns)]
    if not files:
        return t.table(t.REQUESTS).empty()
    return pl.scan_parquet(files, missing_columns="insert", extra_columns="ignore",
                           storage_options=polars_options(root.root)).filter(
        pl.col(c.ARRIVAL_NS).is_between(lo_ns, hi_ns, closed="left")).collect()


def _key(values: tuple | list) -> Key:
    service, model, host = (str(v) if v is not None else "" for v in values)
    return service, model, host


def per_host(windows: pl.DataFrame) -> pl.DataFrame:
    """``windows`` without the fleet-wide rows (``host_name = '*'``): a family that holds a
    row and the rows it sums double-counts under ``sum by``."""
    if windows.is_empty():
        return windows
    return windows.filter(pl.col(c.HOST_NAME).fill_null("") != FLEET_WIDE)


__all__ = ["Histogram", "LATENCY_COLUMNS", "RequestCounters", "per_host"]
