"""Queries behind the capacity page: the rows the latest analytics run stored.

Analytics (``analytics/capacity/``) writes one `capacity` row per pool (service, model, GPU
model, TP, configuration), each pool's fitted curve (`capacity_curve`) and its elasticity
points (`capacity_windows`, with MBU and MFU per instance and window). Nothing here fits a
curve or finds a knee: the rows are read as stored, of the newest run only (``ts_ns``), for
the services and models in scope; the time range limits the points and the heatmap.
"""

from __future__ import annotations

import duckdb
import polars as pl

from fleetlens.dashboard.filters import Filters, where
from fleetlens.dashboard.queries import run
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

_DIMS = (c.SERVICE_NAME, c.MODEL)
_POOL = f"{c.SERVICE_NAME}, {c.MODEL}, {c.GPU_MODEL}, {c.TP}, {c.CONFIG}"


def _latest(con: duckdb.DuckDBPyConnection, f: Filters, table: str, order: str
            ) -> pl.DataFrame:
    clause, params = where(con, f, time_col=None, dims=_DIMS)
    return run(con, f"""
        SELECT * FROM {table}
        WHERE {clause} AND {c.TS_NS} = (SELECT max({c.TS_NS}) FROM {table})
        ORDER BY {order}""", params)


def capacity_pools(con: duckdb.DuckDBPyConnection, f: Filters) -> pl.DataFrame:
    """One `capacity` row per pool of the newest run."""
    return _latest(con, f, t.CAPACITY, _POOL)


def capacity_curve(con: duckdb.DuckDBPyConnection, f: Filters) -> pl.DataFrame:
    """Every pool's fitted curve (`capacity_curve`) of the newest run, by batch."""
    return _latest(con, f, t.CAPACITY_CURVE, f"{_POOL}, {c.BATCH}")


def capacity_points(con: duckdb.DuckDBPyConnection, f: Filters) -> pl.DataFrame:
    """The elasticity points (`capacity_windows`) in the time range, oldest first."""
    clause, params = where(con, f, time_col=c.WINDOW_START_NS, dims=_DIMS)
    return run(con, f"""
        SELECT * FROM {t.CAPACITY_WINDOWS} WHERE {clause}
        ORDER BY {c.WINDOW_START_NS}, {c.HOST_NAME}, {c.INSTANCE_ID}""", params)


def pool_label(row: dict) -> str:
    """``service / model on GPU tpN [config]``: a pool as the page names it."""
    return (f"{row[c.SERVICE_NAME]} / {row[c.MODEL]} on {row[c.GPU_MODEL]} "
            f"tp{row[c.TP]} [{row[c.CONFIG]}]")
