"""The reduce's bounded merge: the shards' pieces of one table, each sorted by the table's
key, -> the hour's partition, one range of the key's first column at a time.

A reduce that concatenates every shard's piece and sorts them holds the hour's rows: its
memory grows with the fleet (2.8 GB for the ``request_energy`` of a 1,024-GPU hour). Here
the shards write their pieces to files (:func:`stage`) and the reduce cuts the key's first
column into ranges of about ``budget`` rows (:func:`range_bounds`, from the pieces' own
sorted values), reads each range from every piece (the pieces are sorted, so a range filter
skips the row groups outside it), sorts it and writes it on (:func:`sink_sorted`): it holds
one range, whatever the fleet's size.

The bytes do not depend on the ranges: :func:`sink_sorted` writes the row groups
:func:`~pipeline.partitions.publish` writes for the same rows in one frame (fixed row
groups, ``ROW_GROUP_ROWS``), so a partition merged in any number of ranges from any number
of shards is the file one shard over the whole hour publishes.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq

from fleetlens.pipeline.storage import DataDir, remove_tree, write_parquet_atomic
from fleetlens.pipeline.storage.publish import tmp_path_for

#: How partitions are encoded (zstd level 1: about 30% less encoding time than the default
#: level for 5% larger files; derived partitions are rewritten often and are not the
#: long-term store, raw data is), in row groups of a fixed size: Polars' own choice depends
#: on the frame's height and chunks, so a partition written a range at a time would not be
#: the bytes of one frame. :func:`pipeline.partitions.publish` and the Ray tasks use these.
PARQUET_OF_PARTITIONS = {"compression": "zstd", "compression_level": 1,
                         "row_group_size": 131_072}

#: Rows per row group of a staged piece at most: the granularity a range reads a piece at.
STAGED_ROW_GROUP = 16_384


def staged_row_group(budget: int, pieces: int) -> int:
    """Rows per row group for a piece of one of ``pieces`` merged ``budget`` rows at a time:
    a range reads up to one row group too many from each piece, so that overshoot is kept to
    half the budget however many pieces there are (between 256 and ``STAGED_ROW_GROUP``)."""
    return max(256, min(STAGED_ROW_GROUP, budget // (2 * max(1, pieces))))


@dataclass(frozen=True)
class Staged:
    """Rows written to a file and not published: a shard's sorted piece of a table, or a
    partition the reduce wrote under a hidden name beside its final one (which the driver
    renames into place, :func:`~pipeline.partitions.publish_staged`)."""

    path: Path
    rows: int


Piece = pl.DataFrame | Staged


def stage(frame: pl.DataFrame, path: Path, row_group_size: int = STAGED_ROW_GROUP) -> Staged:
    """``frame`` (sorted by its table's key) written to ``path`` for the reduce: small row
    groups, so a key range reads little more than itself; lz4, which is cheap to write and
    read back. Written whole or not at all: a retried shard task replaces it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_parquet_atomic(frame, path, compression="lz4", row_group_size=row_group_size)
    return Staged(path, frame.height)


def scan(piece: Piece) -> pl.LazyFrame:
    """A piece's rows, lazily (a staged piece is read only where a query needs it)."""
    return piece.lazy() if isinstance(piece, pl.DataFrame) else pl.scan_parquet(piece.path)


def rows(piece: Piece) -> int:
    return piece.height if isinstance(piece, pl.DataFrame) else piece.rows


def _samples(piece: Piece, column: str) -> pl.DataFrame:
    """Sampled values of ``column`` in a piece sorted by it, each with the rows it stands
    for: a staged piece's first value of each row group (from its footer), an in-memory
    piece's every ``STAGED_ROW_GROUP // 4``-th value."""
    if isinstance(piece, pl.DataFrame):
        step = STAGED_ROW_GROUP // 4
        values = piece.get_column(column).drop_nulls().gather_every(step)
        return pl.DataFrame({"value": values, "rows": [step] * len(values)})
    meta = pq.ParquetFile(piece.path).metadata
    index = meta.schema.names.index(column)
    groups = [meta.row_group(g) for g in range(meta.num_row_groups)]
    firsts = [(g.column(index).statistics, g.num_rows) for g in groups]
    kept = [(s.min, n) for s, n in firsts if s is not None and s.has_min_max]
    return pl.DataFrame({"value": [v for v, _ in kept], "rows": [n for _, n in kept]},
                        schema_overrides={"rows": pl.Int64})


def range_bounds(pieces: list[Piece], column: str, budget: int) -> list[Any]:
    """Increasing cut points of ``column`` such that each range between two holds about
    ``budget`` rows of all the pieces (each sorted by ``column``; nulls first), give or take
    the sampling (a staged piece's row group). None when the pieces hold at most ``budget``
    rows: one range."""
    if sum(rows(p) for p in pieces) <= budget:
        return []
    samples = [s for p in pieces if rows(p) and (s := _samples(p, column)).height]
    if not samples:
        return []
    table = pl.concat(samples, how="vertical_relaxed").sort("value")
    # the rows before each sample, in budgets: a cut where that count enters a new budget
    before = (table.get_column("rows").cum_sum() - table.get_column("rows")) // budget
    cuts = table.filter(before != before.shift(1, fill_value=0)).get_column("value")
    return cuts.unique(maintain_order=True).to_list()


def range_filters(column: str, bounds: list[Any]) -> list[pl.Expr]:
    """One filter per range between consecutive ``bounds`` (the first takes the nulls)."""
    col = pl.col(column)
    if not bounds:
        return [pl.lit(True)]
    first = [col.is_null() | (col < bounds[0])]
    middle = [(col >= lo) & (col < hi) for lo, hi in zip(bounds, bounds[1:], strict=False)]
    return [*first, *middle, col >= bounds[-1]]


def sorted_ranges(pieces: list[Piece], key: list[str], budget: int,
                  fix: Callable[[pl.DataFrame], pl.DataFrame] | None = None,
                  stable: bool = False) -> Iterator[pl.DataFrame]:
    """The pieces' rows sorted by ``key``, one range of its first column at a time; ``fix``
    (if given) is applied to each range before it is sorted. ``key`` unique across the
    pieces, or ``stable``: rows with equal keys keep the pieces' order (piece by piece)."""
    lazies = [scan(p) for p in pieces]
    for where in range_filters(key[0], range_bounds(pieces, key[0], budget)):
        frame = pl.concat([lf.filter(where) for lf in lazies], how="vertical_relaxed").collect()
        yield (fix(frame) if fix else frame).sort(key, maintain_order=stable)


def merged(pieces: list[Piece], key: list[str], budget: int, write_to: Path | None,
           fix: Callable[[pl.DataFrame], pl.DataFrame] | None = None,
           stable: bool = False) -> Piece:
    """The pieces as one table sorted by ``key`` (:func:`sorted_ranges`): written beside
    ``write_to`` (a partition's file, :func:`sink_sorted`) when given, else one frame. An
    empty frame when no piece has a row (publishing it removes the partition)."""
    if not any(rows(p) for p in pieces):
        first = pieces[0] if pieces else None
        return first if isinstance(first, pl.DataFrame) else pl.DataFrame()
    # An empty piece adds no row, and its columns may be fewer (a partition that does not
    # exist reads as the contract's columns, pipeline/dirtyhosts.py).
    pieces = [p for p in pieces if rows(p)]
    if len(pieces) == 1 and isinstance(pieces[0], pl.DataFrame) and write_to is None:
        return fix(pieces[0]) if fix else pieces[0]
    ranges = sorted_ranges(pieces, key, budget, fix, stable)
    if write_to is None:
        return pl.concat(list(ranges), how="vertical_relaxed")
    return sink_sorted(ranges, write_to, **PARQUET_OF_PARTITIONS)


def sink_sorted(ranges: Iterator[pl.DataFrame], path: Path, **parquet: Any) -> Staged:
    """Write ``ranges`` one after the other to a hidden file beside ``path`` (fsynced, not
    yet renamed over it) with the ``parquet`` options :func:`partitions.publish` uses: the
    same bytes as one frame of every range written there. Holds one range at a time (the
    ranges share one schema: each is the same pieces' rows)."""
    from polars.io.plugins import register_io_source

    first = next(ranges, None)
    if first is None:
        raise ValueError("nothing to write: no range")
    written = 0

    def source(with_columns: list[str] | None, predicate: pl.Expr | None,
               n_rows: int | None, batch_size: int | None) -> Iterator[pl.DataFrame]:
        nonlocal written
        for frame in itertools.chain([first], ranges):
            written += frame.height
            if predicate is not None:
                frame = frame.filter(predicate)
            yield frame if with_columns is None else frame.select(with_columns)

    target = tmp_path_for(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        register_io_source(source, schema=first.schema).sink_parquet(target, **parquet)
        with open(target, "rb") as handle:
            os.fsync(handle.fileno())
    except BaseException:
        target.unlink(missing_ok=True)
        raise
    return Staged(target, written)


def staging_root(dd: DataDir) -> Path:
    """The folder every staging folder is under (a run removes what a dead one left)."""
    return dd.state / "staging"


def staging_path(dd: DataDir, phase: int, hour: int) -> Path:
    """The staging folder of an hour's ``phase`` (see :func:`staging_folder`)."""
    return staging_root(dd) / f"phase{phase}-{hour}"


def staging_folder(dd: DataDir, phase: int, hour: int) -> Path | None:
    """Where the shards of an hour's ``phase`` write what its reduce reads a range at a time
    (``state/staging/phase<N>-<hour>``, emptied first: a run that died may have left pieces);
    None on an object store, where the shards return their results and the reduce merges
    them in memory (ranged reads of an object are not implemented)."""
    if dd.remote:
        return None
    folder = staging_path(dd, phase, hour)
    if folder.exists():
        remove_tree(folder)
    return folder
