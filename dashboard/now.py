"""Queries for the headlines that describe *now*: active incidents, KV headroom.

A headline over the whole range keeps an incident's worst value long after it ended (the KV
page said 1% headroom an hour after the cache emptied, issue 32), and "active" had its own
definition beside the exporter's. Both come from analytics' definitions here, over the
newest minutes of the data in scope.
"""

from __future__ import annotations

import duckdb
import polars as pl

from fleetlens.analytics.open_incidents import closed_until_ns
from fleetlens.dashboard.explore import kv_summary
from fleetlens.dashboard.filters import Filters, where
from fleetlens.dashboard.queries import run
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

NS = 1_000_000_000
#: How far back "now" reaches for the KV headline: five one-minute windows, as the
#: overview's latency headline.
RECENT_S = 5 * 60


def closed_until(con: duckdb.DuckDBPyConnection) -> int | None:
    """The end of the latest closed window of the whole data (the exporter's "now"):
    :func:`analytics.open_incidents.closed_until_ns` over the windows' starts and sizes."""
    frame = run(con, f"SELECT DISTINCT {c.WINDOW_START_NS}, {c.WINDOW_S} FROM {t.WINDOWS}",
                {})
    return closed_until_ns(frame) if frame.height else None


def recent_range(con: duckdb.DuckDBPyConnection, f: Filters) -> Filters:
    """``f`` narrowed to the :data:`RECENT_S` before its newest engine sample in scope."""
    clause, params = where(con, f, time_col=c.TS_NS)
    newest = run(con, f"SELECT max({c.TS_NS}) AS ts FROM {t.ENGINE_SAMPLES} WHERE {clause}",
                 params)["ts"][0]
    if newest is None:
        return f
    return f.with_range(int(newest) - RECENT_S * NS + 1, int(newest) + 1)


def kv_summary_now(con: duckdb.DuckDBPyConnection, f: Filters) -> pl.DataFrame:
    """Analytics' KV summary per instance (usage p95, headroom) over the newest
    :data:`RECENT_S` of the range, so the headline reads the cache as it is now."""
    return kv_summary(con, recent_range(con, f))
