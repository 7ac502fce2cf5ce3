"""The exporter's gauges (:mod:`analytics.exporter`): what the latest *closed* window says
now, per service, model and host (J/token, KV-cache usage, when it closed), and the expected
band of each series then (``baselines``). History is Prometheus': only the current value is
served, and no fleet-wide row sits beside the per-host rows it would double-count.
"""

from __future__ import annotations

import re

import polars as pl
from prometheus_client.core import GaugeMetricFamily, Metric

from fleetlens.pipeline.partitions import files_since, partition_span
from fleetlens.pipeline.schema import FLEET_WIDE
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import exported as x
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, parquet_files, polars_options, retry_vanished

NS = 1_000_000_000
KEYS = (c.SERVICE_NAME, c.MODEL, c.HOST_NAME)
#: window column -> (family, help)
WINDOW_GAUGES = {
    c.J_PER_TOKEN: (x.J_PER_TOKEN, "GPU energy per output token in the latest closed window, J."),
    c.KV_CACHE_USAGE_MEAN: (x.KV_CACHE_USAGE,
                            "Mean KV-cache usage (0..1) in the latest closed window."),
}
#: baselines column -> (family, help)
BANDS = {
    c.EXPECTED: (x.BASELINE_EXPECTED, "Expected value of the series at the latest closed "
                                      "window (its unit is the metric label's)."),
    c.LOWER: (x.BASELINE_LOWER, "Lower edge of the series' normal band then."),
    c.UPPER: (x.BASELINE_UPPER, "Upper edge of the series' normal band then."),
}
# a baselines series is ``metric{service_name=..,model=..,host_name=..}`` (analytics.series)
_SERIES = re.compile(r"^(?P<metric>[^{]+)\{(?P<scope>.*)\}$")
_SPLIT = re.compile(",(?=(?:" + "|".join(KEYS) + ")=)")


#: How far back from the newest window the exporter reads (``fleetlens exporter --lookback``):
#: a series silent longer than this is no longer served, and older partitions are not read.
DEFAULT_LOOKBACK_S = 3600.0


def recent_windows(root: DataDir, lookback_s: float = DEFAULT_LOOKBACK_S,
                   since_ns: int | None = None) -> pl.DataFrame:
    """The stored windows that start within ``lookback_s`` of the newest (empty without
    data), and every one from ``since_ns`` on (for counters that have not read since).

    Only the partitions that can hold them are read: a refresh costs the last hour or two,
    not the table's whole history (issue 33: the exporter rescanned every window).
    """
    lookback_ns = int(lookback_s * NS)

    def read() -> pl.DataFrame:
        files = list(parquet_files(root.table_dir(t.WINDOWS)))
        spans = [partition_span(f) for f in files]
        if files and None not in spans:  # the newest window starts in the newest partition
            cut = max(s[0] for s in spans if s is not None) - lookback_ns
            cut = cut if since_ns is None else min(cut, since_ns)
            files = [f for f, s in zip(files, spans, strict=True) if s is not None and s[1] > cut]
        if not files:
            return pl.DataFrame()
        frame = pl.scan_parquet([str(f) for f in files], missing_columns="insert",
                                extra_columns="ignore",
                                storage_options=polars_options(root.root)).collect()
        if frame.is_empty():
            return frame
        start = pl.col(c.WINDOW_START_NS)
        keep = start >= int(frame[c.WINDOW_START_NS].max()) - lookback_ns
        return frame.filter(keep if since_ns is None else keep | (start >= since_ns))
    return retry_vanished(read)


def latest_closed(windows: pl.DataFrame,
                  lookback_s: float = DEFAULT_LOOKBACK_S) -> pl.DataFrame:
    """The latest closed window of each (service, model, host) with a window in the
    ``lookback_s`` before the newest: the newest window of the data is still filling and
    left out, as on the dashboard."""
    if windows.is_empty():
        return windows
    newest = windows[c.WINDOW_START_NS].max()
    closed = windows.filter(pl.col(c.WINDOW_START_NS) < newest,
                            pl.col(c.WINDOW_START_NS) >= newest - int(lookback_s * NS))
    return closed.sort(c.WINDOW_START_NS).group_by(KEYS, maintain_order=True).last().sort(KEYS)


def window_families(latest: pl.DataFrame) -> list[Metric]:
    """J/token, KV-cache usage and the window's end, per host, from :func:`latest_closed`
    rows without the fleet-wide ones."""
    families: list[Metric] = []
    for column, (name, doc) in WINDOW_GAUGES.items():
        family = GaugeMetricFamily(name, doc, labels=x.SCOPE)
        for row in latest.iter_rows(named=True) if column in latest.columns else ():
            if row[column] is not None:
                family.add_metric(_scope(row), float(row[column]))
        families.append(family)
    ended = GaugeMetricFamily(x.WINDOW_END, "Unix time the latest closed window closed.",
                              labels=x.SCOPE)
    for row in latest.iter_rows(named=True):
        ended.add_metric(_scope(row), (row[c.WINDOW_START_NS] + row[c.WINDOW_S] * NS) / NS)
    return [*families, ended]


def baseline_families(root: DataDir, closed_start_ns: int | None,
                      lookback_s: float = DEFAULT_LOOKBACK_S) -> list[Metric]:
    """Expected value and band of every series with a band in the ``lookback_s`` up to the
    latest closed window (its start ``closed_start_ns``), at that window. A service-wide band
    has no ``host`` label, a fleet-wide one neither ``service`` nor ``model``: ``*`` would
    read as one more host."""
    families = {col: GaugeMetricFamily(name, doc, labels=(c.METRIC, *x.SCOPE, c.METHOD))
                for col, (name, doc) in BANDS.items()}
    bands = pl.DataFrame()
    if closed_start_ns is not None:
        since = closed_start_ns - int(lookback_s * NS)
        bands = retry_vanished(lambda: _read_since(root, t.BASELINES, since)).filter(
            pl.col(c.TS_NS).is_between(since, closed_start_ns))
    if not bands.is_empty():
        bands = (bands.sort(c.TS_NS)
                 .group_by(c.SERIES, c.METHOD, maintain_order=True).last().sort(c.SERIES))
    for row in bands.iter_rows(named=True):
        labels = _series_labels(row[c.SERIES])
        if labels is None:
            continue
        for col, family in families.items():
            if row[col] is not None:
                family.add_metric([*labels, str(row[c.METHOD])], float(row[col]))
    return list(families.values())


def _read_since(root: DataDir, table: str, since_ns: int) -> pl.DataFrame:
    files = [str(f) for f in files_since(root, table, since_ns)]
    if not files:
        return t.table(table).empty()
    return pl.scan_parquet(files, missing_columns="insert", extra_columns="ignore",
                           storage_options=polars_options(root.root)).filter(
        pl.col(c.TS_NS) >= since_ns).collect()


def _series_labels(series: str) -> list[str] | None:
    match = _SERIES.match(series)
    if match is None:
        return None
    scope = dict(part.split("=", 1) for part in _SPLIT.split(match["scope"]) if "=" in part)
    return [match["metric"], *(_label(scope.get(k)) for k in KEYS)]


def _label(value: object) -> str:
    return "" if value is None or value == FLEET_WIDE else str(value)


def _scope(row: dict) -> list[str]:
    return [_label(row[k]) for k in KEYS]


__all__ = ["DEFAULT_LOOKBACK_S", "baseline_families", "latest_closed", "recent_windows",
           "window_families"]
