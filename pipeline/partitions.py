"""Reading and publishing derived hour partitions: ``derived/<table>/date=D/hour=H/part.parquet``.

A partition is always rewritten whole from its inputs, sorted by the table's key, so a rerun
over the same input publishes byte-identical files.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

from fleetlens.pipeline.rangemerge import PARQUET_OF_PARTITIONS, Staged
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import (
    DataDir,
    fsync_dir,
    hour_partition,
    parquet_files,
    parquet_source,
    polars_options,
    read_parquet_if_exists,
    write_parquet_atomic,
)

NS = 1_000_000_000
HOUR_NS = 3600 * NS
PART_NAME = "part.parquet"
#: How partitions are encoded (see :data:`~pipeline.rangemerge.PARQUET_OF_PARTITIONS`).
PARQUET = PARQUET_OF_PARTITIONS
#: Rows per row group of every derived partition (fixed: see there).
ROW_GROUP_ROWS: int = PARQUET["row_group_size"]  # type: ignore[assignment]


def hour_of(ts_ns: int) -> int:
    """Start (ns) of the UTC hour holding ``ts_ns``."""
    return ts_ns - ts_ns % HOUR_NS


def partition_file(data_dir: DataDir, table: str, hour_ns: int) -> Path:  # or an ObjectPath
    """Path of the one file of a derived table's hour partition."""
    day, hour = hour_partition(hour_ns)
    return data_dir.partition_path(table, date=day, hour=hour) / PART_NAME


def publish(data_dir: DataDir, table: str, hour_ns: int, frame: pl.DataFrame) -> int:
    """Replace one hour partition with ``frame`` (removing it when empty); returns rows."""
    path = partition_file(data_dir, table, hour_ns)
    if frame.height == 0:
        path.unlink(missing_ok=True)
        return 0
    write_parquet_atomic(frame.rechunk(), path, **PARQUET)
    return frame.height


def publish_staged(data_dir: DataDir, table: str, hour_ns: int, staged: Staged) -> int:
    """Publish a partition the reduce wrote beside its place (:func:`rangemerge.sink_sorted`:
    written and fsynced under a hidden name in the partition's folder): renamed over it,
    then the folder fsynced; an empty one removes the partition, as :func:`publish` does."""
    path = partition_file(data_dir, table, hour_ns)
    if staged.rows == 0:
        staged.path.unlink(missing_ok=True)
        path.unlink(missing_ok=True)
        return 0
    if staged.path.parent != path.parent:
        raise ValueError(f"{staged.path} is not beside {path}: it cannot be renamed over it")
    os.replace(staged.path, path)
    fsync_dir(path.parent)
    return staged.rows


def read_hours(data_dir: DataDir, table: str, hours: list[int] | range,
               columns: list[str] | None = None,
               cache: dict[tuple[Path, tuple[str, ...] | None], pl.DataFrame] | None = None,
               ) -> pl.DataFrame:
    """The rows of the given hour partitions (an empty contract frame when none exist).

    Args:
        columns: read only these columns (every column by default); the empty frame then
            holds those of them the contract has.
        cache: partitions already read (by path and columns), filled as files are read; for a
            caller that reads overlapping hours several times while nothing is published.
    """
    frames = []
    for path in (partition_file(data_dir, table, h) for h in hours):
        key = (path, None if columns is None else tuple(columns))
        if cache is not None and key in cache:
            frames.append(cache[key])
        elif (frame := read_parquet_if_exists(path, columns)) is not None:
            frames.append(frame)
            if cache is not None:
                cache[key] = frame
    if not frames:
        empty = t.table(table).empty()
        return empty if columns is None else empty.select(
            n for n in columns if n in empty.columns)
    return pl.concat(frames, how="diagonal_relaxed")


def hours_between(lo_ns: int, hi_ns: int) -> range:
    """Hour starts of every hour touching ``[lo_ns, hi_ns]``."""
    return range(hour_of(lo_ns), hour_of(hi_ns) + 1, HOUR_NS)


def existing_hours(data_dir: DataDir, table: str) -> list[int]:
    """Hour starts of every published partition of ``table``."""
    out = []
    for path in parquet_files(data_dir.derived(table)):
        day = path.parent.parent.name.partition("=")[2]
        hour = path.parent.name.partition("=")[2]
        moment = dt.datetime.strptime(f"{day} {hour}", "%Y-%m-%d %H").replace(tzinfo=dt.UTC)
        out.append(int(moment.timestamp()) * NS)
    return sorted(set(out))


def files_since(data_dir: DataDir, table: str, since_ns: int) -> list[Path]:
    """The Parquet files of ``table`` that may hold rows at or after ``since_ns``: those whose
    ``date=``/``hour=`` partition ends after it, and any file outside such a partition.

    One listing, no file opened: readers of recent rows (the exporter) skip the history.
    """
    return [path for path in parquet_files(data_dir.table_dir(table))
            if (span := partition_span(path)) is None or span[1] > since_ns]


def partition_span(path: Path) -> tuple[int, int] | None:
    """``(start, end)`` in ns of the day or hour partition holding the file ``path``; None
    outside one."""
    parts = dict(p.partition("=")[::2] for p in (path.parent.parent.name, path.parent.name)
                 if "=" in p)
    try:
        day = dt.datetime.strptime(parts["date"], "%Y-%m-%d").replace(tzinfo=dt.UTC)
        hour = int(parts["hour"]) if "hour" in parts else None
    except (KeyError, ValueError):
        return None
    start = int(day.timestamp()) * NS
    if hour is None:
        return start, start + 24 * HOUR_NS
    return start + hour * HOUR_NS, start + (hour + 1) * HOUR_NS


def read_raw(files: list[str], table: str, predicate: pl.Expr,
             columns: tuple[str, ...] | None = None,
             categorical: tuple[str, ...] = (),
             within: tuple[str, int, int] | None = None) -> pl.DataFrame:
    """Rows of raw segments matching ``predicate``: ``columns`` of the contract (all by
    default) with the contract's dtypes, a column missing from a file read as nulls.

    The ``categorical`` columns come back as ``pl.Categorical`` instead, decoded straight from
    the files' Parquet dictionaries: no string is materialised per row, so a metric point's
    attribute map (the same string for millions of points) costs a 4-byte code.

    ``within`` (column, lo, hi), with ``categorical``: ``predicate`` keeps only rows with
    ``lo <= column < hi``, so row groups whose statistics put them all outside are not read
    (:func:`row_groups_within`).
    """
    spec = t.table(table)
    names = list(columns or spec.columns)
    if not files:
        return spec.empty().select(names)
    if categorical:
        return _read_dictionaries(files, spec, names, predicate, categorical, within)
    frame = pl.scan_parquet(files, missing_columns="insert", extra_columns="ignore",
                            storage_options=polars_options(files[0]))
    present = frame.collect_schema()
    frame = frame.select(
        pl.col(n).cast(spec.columns[n]) if n in present else pl.lit(None, spec.columns[n]).alias(n)
        for n in names
    )
    return frame.filter(predicate).collect()


#: Rows of small segments gathered before one cast and filter (bounds the unfiltered rows held).
_BATCH_ROWS = 1 << 20
#: Rows decoded at once from one segment: a bigger segment is read in runs of row groups of
#: about this many rows (:func:`row_group_runs`). A segment holds every host's rows, so a
#: (host group x hour) shard keeps a small part of each: decoding a whole segment of a big
#: fleet (1.4M rows a minute at 1,024 GPUs) held about 200 MB more than the shard keeps,
#: growing with the fleet (bench/scale.py --memory).
_READ_ROWS = 1 << 18


def row_groups_within(metadata: pq.FileMetaData, column: str, lo: int, hi: int) -> list[int]:
    """The row groups of a file that may hold rows with ``lo <= column < hi``: all but those
    whose min/max statistics of ``column`` lie wholly outside (a row group without statistics
    is kept).

    The collector writes a segment's rows in arrival order, about time order, in row groups of
    about 120k rows: phase 1 of an hour reads the previous hour's last segment for one sample
    gap (60 s) of it, and this lets it read one row group of that segment instead of all."""
    schema = metadata.schema
    index = next((i for i in range(len(schema)) if schema.column(i).path == column), None)
    keep = []
    for group in range(metadata.num_row_groups):
        stats = None if index is None else metadata.row_group(group).column(index).statistics
        if (stats is not None and stats.has_min_max
                and (stats.max < lo or stats.min >= hi)):
            continue
        keep.append(group)
    return keep


def row_group_runs(metadata: pq.FileMetaData, groups: list[int] | None,
                   rows: int = _READ_ROWS) -> list[list[int]] | None:
    """``groups`` of a file (None: all) in consecutive runs of at most ``rows`` rows (a run
    holds at least one group); None when one read of the whole file is as small (the file
    has at most ``rows`` rows, or one group)."""
    every = list(range(metadata.num_row_groups))
    chosen = every if groups is None else groups
    if groups is None and (metadata.num_rows <= rows or len(every) <= 1):
        return None
    runs: list[list[int]] = []
    size = 0
    for group in chosen:
        count = metadata.row_group(group).num_rows
        if runs and size + count <= rows:
            runs[-1].append(group)
            size += count
        else:
            runs.append([group])
            size = count
    return runs


def _read_dictionaries(files: list[str], spec: t.Table, names: list[str], predicate: pl.Expr,
                       categorical: tuple[str, ...],
                       within: tuple[str, int, int] | None = None) -> pl.DataFrame:
    """:func:`read_raw` through pyarrow, keeping the ``categorical`` columns dictionary-coded.

    The collector publishes a segment every 25,000 rows, about 230 an hour for a 64-GPU fleet at
    10 Hz, so the cost per file matters as much as per row: one footer parse per file, no
    per-file thread pool (the pipeline already reads two hours at once), and the cast and
    filter applied once per batch of files instead of once per file. On an hour of 213
    collector-sized segments this takes about 30% less CPU than a threaded read, cast and
    filter per file (``docs/benchmarks-history.md``).
    """
    out: list[pl.DataFrame] = []
    batch: list[pl.DataFrame] = []
    rows = 0

    def flush() -> None:
        nonlocal rows
        frame = pl.concat(batch, how="diagonal_relaxed") if len(batch) > 1 else batch[0]
        out.append(frame.select(
            (pl.col(n) if n in frame.columns else pl.lit(None, spec.columns[n]).alias(n)).cast(
                pl.Categorical() if n in categorical else spec.columns[n])
            for n in names
        ).filter(predicate))
        batch.clear()
        rows = 0

    for path in files:
        # ParquetFile, not read_table: read_table goes through pyarrow.dataset, whose import
        # (pandas included) costs half a second per process.
        # The footer is parsed once: the columns present decide which to read as dictionaries
        # (naming an absent one is an error), and the same metadata opens the file.
        source = parquet_source(path)  # an object's bytes, fetched once, on an object store
        metadata = pq.read_metadata(source)
        present = set(metadata.schema.names)
        with pq.ParquetFile(source, metadata=metadata,
                            read_dictionary=[n for n in categorical if n in present]) as handle:
            wanted = [n for n in names if n in present]
            groups = (None if within is None
                      else row_groups_within(metadata, *within))
            if groups is not None and len(groups) == metadata.num_row_groups:
                groups = None
            runs = row_group_runs(metadata, groups, _READ_ROWS)
            if runs is None:
                pieces = [handle.read(columns=wanted, use_threads=False)]
            elif not runs:  # no group at all: an empty table with the file's schema
                pieces = [handle.read_row_groups([], columns=wanted, use_threads=False)]
            else:
                pieces = (handle.read_row_groups(run, columns=wanted, use_threads=False)
                          for run in runs)
            for arrow in pieces:
                frame = pl.from_arrow(arrow)
                assert isinstance(frame, pl.DataFrame)
                batch.append(frame)
                rows += frame.height
                if rows >= _BATCH_ROWS:
                    flush()
    if batch:
        flush()
    return pl.concat(out) if len(out) > 1 else out[0]
