"""Where an analytics run's tables and state live in the data directory, and how they are
written and read back (:func:`publish`, :func:`read_table`, :func:`state_dir`).

Its own module so that the stages that publish tables of their own (Prophet baselines, the
capacity tables) and :mod:`analytics.runner`, which calls them, do not import each other.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import (
    DataDir,
    hour_partition,
    parquet_files,
    write_parquet_atomic,
)

FILE_NAME = "analytics.parquet"


def state_dir(data_dir: DataDir) -> Path:
    """Where analytics keeps its state (webhook deliveries, provenance, Prophet schedule)."""
    return data_dir.state / "analytics"


def _date(ts_col: str) -> pl.Expr:
    return pl.from_epoch(pl.col(ts_col), time_unit="ns").dt.strftime("%Y-%m-%d").alias(c.DATE)


def publish(data_dir: DataDir, table: str, frame: pl.DataFrame, ts_col: str,
            name: str = FILE_NAME, since_ns: int | None = None) -> int:
    """Write ``frame`` as one file per UTC date; remove our stale files of dates it no
    longer covers (at or after ``since_ns``). Returns the number of files written."""
    written = set()
    if frame.height:
        for (day,), part in frame.with_columns(_date(ts_col)).group_by(c.DATE):
            path = data_dir.partition_path(table, date=day) / name
            write_parquet_atomic(part.drop(c.DATE).sort(ts_col), path)
            written.add(path)
    oldest_day = hour_partition(since_ns)[0] if since_ns is not None else None
    for path in parquet_files(data_dir.table_dir(table)):
        day = path.parent.name.partition("=")[2]
        if path.name == name and path not in written and (
                oldest_day is None or day >= oldest_day):
            path.unlink()
    return len(written)


def read_table(data_dir: DataDir, table: str) -> pl.DataFrame:
    """A derived analytics table as written by :func:`run` (empty contract frame if none)."""
    files = [str(p) for p in parquet_files(data_dir.table_dir(table))]
    if not files:
        return t.table(table).empty()
    return pl.read_parquet(files, missing_columns="insert")
