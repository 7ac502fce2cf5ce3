"""The latency heatmap of a trace search: requests counted per (arrival-time bucket,
log-spaced latency bucket) of one latency column, the grid a user selects a region of
(:mod:`analytics.traces.compare` says what is different about that region).

Input: the view's requests (:func:`analytics.traces.compare.view_frame`). Output: a
:class:`Heatmap`, its edges chosen here so a page and the CLI draw the same grid. Time
buckets are whole seconds of a "nice" width, aligned to the epoch (a one-minute bucket starts
on the minute), so a selection snapped to bucket edges is a range a link can carry exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import polars as pl

from fleetlens.pipeline.schema import columns as c

NS = 1_000_000_000
#: Latency columns a heatmap (and a selection) may use.
METRICS = (c.TTFT_S, c.TPOT_S, c.E2E_S, c.QUEUE_S)
#: Time bucket widths (s) a heatmap picks from: the smallest with at most ``time_buckets``.
_WIDTHS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600,
             43200, 86400)


@dataclass(frozen=True)
class Heatmap:
    """Counts of requests per cell. ``time_edges_ns`` and ``latency_edges`` bound the cells
    (n + 1 edges for n buckets; a latency bucket holds ``[edge, next edge)``, the last one
    its upper edge too);
    ``cells`` holds one row per non-empty cell: ``time_bucket``, ``latency_bucket`` (0-based
    indexes) and ``count``."""

    metric: str
    time_edges_ns: list[int]
    latency_edges: list[float]
    cells: pl.DataFrame

    @property
    def total(self) -> int:
        """Requests in the grid (those with a value of the metric)."""
        return int(self.cells["count"].sum()) if self.cells.height else 0

    def matrix(self) -> list[list[int]]:
        """Counts as rows of latency buckets (lowest first), one column per time bucket."""
        grid = [[0] * (len(self.time_edges_ns) - 1) for _ in self.latency_edges[1:]]
        for tb, lb, n in self.cells.iter_rows():
            grid[lb][tb] = n
        return grid


def _nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^k at or above ``value`` (> 0)."""
    exponent = math.floor(math.log10(value))
    for step in (1.0, 2.0, 2.5, 5.0, 10.0):
        if step * 10**exponent >= value:
            return step * 10**exponent
    return 10.0 ** (exponent + 1)


def time_width_s(span_ns: int, time_buckets: int) -> int:
    """The bucket width (s) for ``span_ns`` of arrivals in at most ``time_buckets``."""
    need = span_ns / NS / max(time_buckets, 1)
    return next((w for w in _WIDTHS_S if w >= need), _WIDTHS_S[-1])


def heatmap(frame: pl.DataFrame, metric: str, *, time_buckets: int = 60,
            latency_buckets: int = 40, min_width_s: int = 1) -> Heatmap:
    """Count ``frame``'s requests by arrival and ``metric``.

    Args:
        frame: requests with ``arrival_ns`` and ``metric``; rows with a null metric (a TPOT of
            a one-token answer) are left out.
        metric: one of :data:`METRICS`.
        time_buckets: at most this many time buckets.
        latency_buckets: this many latency buckets (:func:`latency_edges`).
        min_width_s: time buckets at least this wide (60: a selection snapped to bucket
            edges is a whole-minute range, what the dashboard's time range can carry).
    """
    rows = frame.select(c.ARRIVAL_NS, metric).drop_nulls()
    if rows.is_empty():
        return Heatmap(metric, [], [], pl.DataFrame(
            schema={"time_bucket": pl.Int64, "latency_bucket": pl.Int64, "count": pl.Int64}))
    first, last = int(rows[c.ARRIVAL_NS].min()), int(rows[c.ARRIVAL_NS].max())
    width = max(time_width_s(last - first + 1, time_buckets), min_width_s) * NS
    start = first // width * width
    n_time = (last - start) // width + 1
    edges = latency_edges(rows[metric], latency_buckets)
    index = np.searchsorted(np.asarray(edges), rows[metric].to_numpy(), side="right") - 1
    cells = (rows.select(((pl.col(c.ARRIVAL_NS) - start) // width).cast(pl.Int64)
                         .alias("time_bucket"))
             .with_columns(pl.Series("latency_bucket", index.clip(0, latency_buckets - 1),
                                     dtype=pl.Int64))
             .group_by("time_bucket", "latency_bucket")
             .agg(pl.len().cast(pl.Int64).alias("count"))
             .sort("time_bucket", "latency_bucket"))
    return Heatmap(metric, [start + i * width for i in range(n_time + 1)], edges, cells)


def latency_edges(values: pl.Series, buckets: int) -> list[float]:
    """``buckets + 1`` edges, log-spaced from a power of ten at or below the fastest
    positive value (at least 1 ms) to a round bound at or above the slowest; the first edge is
    0, so the lowest bucket holds everything below. Log-spaced: a KV-cache incident's TTFTs
    run from 20 ms to minutes, and linear buckets put every normal request in the first."""
    positive = values.filter(values > 0)
    floor = max(float(positive.min()), 1e-3) if len(positive) else 1e-3
    low = 10.0 ** math.floor(math.log10(floor))
    high = max(_nice_ceiling(max(float(values.max()), low * 10)), low * 10)
    ratio = high / low
    edges = [float(f"{low * ratio ** (i / (buckets - 1)):.4g}") for i in range(buckets)]
    return [0.0, *edges]
