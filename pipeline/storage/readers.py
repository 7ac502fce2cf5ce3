"""Readers over the data directory: listings that tolerate vanished files, DuckDB views,
Polars scans, damaged-file reports."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

if TYPE_CHECKING:  # DuckDB and Polars only for readers: the collector never loads them (RSS)
    import duckdb
    import polars as pl
from fleetlens.pipeline.storage.base import PARQUET_SUFFIX, StorageError, T, is_remote
from fleetlens.pipeline.storage.layout import DataDir
from fleetlens.pipeline.storage.objects import ObjectPath


def parquet_files(folder: Path) -> Iterator[Path]:
    """Every published Parquet file under ``folder`` (hidden temporary files excluded)."""
    if is_remote(folder):  # one listing, which also gives each file's size (stat is free)
        files = sorted(p for p in folder.files()  # type: ignore[attr-defined]
                       if p.name.endswith(PARQUET_SUFFIX) and not p.name.startswith("."))
        yield from files
        return
    if folder.is_dir():
        files = sorted(folder.rglob(f"*{PARQUET_SUFFIX}"))
        yield from (p for p in files if not p.name.startswith("."))


def has_parquet(folder: Path) -> bool:
    """Whether ``folder`` holds a published Parquet file (stops at the first one found)."""
    if is_remote(folder):
        return any(p.name.endswith(PARQUET_SUFFIX) and not p.name.startswith(".")
                   for p in folder.files())  # type: ignore[attr-defined]
    for _, _, files in os.walk(folder):
        if any(f.endswith(PARQUET_SUFFIX) and not f.startswith(".") for f in files):
            return True
    return False


def existing_tables(data_dir: DataDir, among: Iterable[str] | None = None) -> list[str]:
    """Names of the contract tables (``among`` these) that have at least one Parquet file."""
    wanted = t.TABLES if among is None else set(among)
    return [name for name in t.TABLES
            if name in wanted and has_parquet(data_dir.table_dir(name))]


def remove_tree(folder: Path | ObjectPath) -> None:
    """Delete ``folder`` and everything under it (every object under the prefix)."""
    if is_remote(folder):
        folder.remove_tree()  # type: ignore[union-attr]
    else:
        import shutil

        shutil.rmtree(folder)


#: Tries of a read that lost a file between listing and opening it (see :func:`retry_vanished`).
READ_ATTEMPTS = 4
_VANISHED = ("No such file or directory", "No files found that match the pattern",
             # DuckDB over s3fs: an object listed by the glob, gone when opened
             "FileNotFoundError: ")


def is_vanished_file(error: BaseException) -> bool:
    """Whether ``error`` says a file the read had listed was gone when it was opened."""
    return isinstance(error, FileNotFoundError) or any(text in str(error) for text in _VANISHED)


def retry_vanished(read: Callable[[], T], attempts: int = READ_ATTEMPTS) -> T:
    """``read()``, tried again when it failed only because a file it listed had vanished.

    Globs are expanded when a query runs, and ``fleetlens compact`` deletes the segments it
    merged (after publishing the merged file), retention deletes old partitions: a reader
    that listed a file just before may not open it. Listing again finds the merged file,
    which holds the same rows, so the retried read answers as if it had run a moment later.
    Any other error, or the last try's, is raised as it is.
    """
    for _ in range(attempts - 1):
        try:
            return read()
        except Exception as error:
            if not is_vanished_file(error):
                raise
    return read()


# -- readers ---------------------------------------------------------------------------

def table_glob(data_dir: DataDir, table: str) -> str:
    """The recursive Parquet glob of a table, for DuckDB or Polars scans."""
    return str(data_dir.table_dir(table) / "**" / f"*{PARQUET_SUFFIX}")


def tables_named_in(query: str) -> list[str]:
    """The contract tables whose names appear as words in ``query`` (a superset of those it
    reads: a column called ``requests`` counts too, which only costs a view)."""
    return [name for name in t.TABLES
            if re.search(rf"(?<![\w$]){re.escape(name)}(?![\w$])", query, re.IGNORECASE)]


def connect(data_dir: DataDir, *, read_only_sandbox: bool = False,
            tables: Iterable[str] | None = None) -> duckdb.DuckDBPyConnection:
    """A new in-memory DuckDB with one view per contract table over its Parquet files.

    Tables without data yet are empty views with the contract's columns, so queries over a
    new data directory return zero rows instead of failing.

    Args:
        data_dir: the data directory to read.
        read_only_sandbox: turn off external access and lock the configuration after the
            views are made (for consoles that run user SQL).
        tables: make views of these tables only (e.g. :func:`tables_named_in` of a query).
            A view over Parquet reads every file's footer when it is made, about 0.2 ms a
            file, so a one-off query over a few tables skips the raw tables' thousands.
    """
    import duckdb

    con = duckdb.connect(":memory:")
    if is_remote(data_dir.root):  # DuckDB reads s3:// through a registered fsspec filesystem
        con.register_filesystem(data_dir.root.bucket.filesystem())  # type: ignore[union-attr]
    wanted = set(t.TABLES if tables is None else tables)
    present = set(existing_tables(data_dir, wanted))
    for name in (n for n in t.TABLES if n in wanted):
        if name in present:
            glob = table_glob(data_dir, name).replace("'", "''")
            # Log records have no id: a copy delivered twice is shown once (the key is their
            # content, tables.LOG_RECORD_KEY_SQL), as pipeline.logsignal counts them.
            select = f"SELECT DISTINCT ON ({t.LOG_RECORD_KEY_SQL}) *" \
                if name == t.LOG_RECORDS else "SELECT *"
            # Which copy DISTINCT ON keeps is arbitrary without an order (parallel scans):
            # the first received, as pipeline.logsignal keeps the first.
            order = f' ORDER BY {t.LOG_RECORD_KEY_SQL}, "{c.RECEIVED_NS}"' \
                if name == t.LOG_RECORDS else ""
            # Creating the view reads every file's schema: compaction may delete one meanwhile.
            retry_vanished(lambda glob=glob, name=name, select=select, order=order: con.execute(
                f'CREATE VIEW "{name}" AS {select} FROM read_parquet('
                f"'{glob}', hive_partitioning = true, union_by_name = true){order}"
            ))
        else:
            # A table with no data yet still answers queries, with zero rows. A real (empty)
            # table rather than a registered frame, so cursors of this connection see it too.
            empty = t.table(name).empty().to_arrow()  # noqa: F841 - read by DuckDB below
            con.execute(f'CREATE TABLE "{name}" AS SELECT * FROM empty')
    if read_only_sandbox:
        # The views read their Parquet lazily, so their folders stay readable; nothing else.
        sep = "/" if is_remote(data_dir.root) else os.sep
        readable = [str(data_dir.root / "raw") + sep, str(data_dir.root / "derived") + sep]
        con.execute("SET allowed_directories = $dirs", {"dirs": readable})
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
    return con


def scan(data_dir: DataDir, table: str) -> pl.LazyFrame:
    """A Polars LazyFrame over a table's Parquet files (an empty contract frame if none)."""
    import polars as pl

    files = [str(p) for p in parquet_files(data_dir.table_dir(table))]
    if not files:
        return t.table(table).empty().lazy()
    return pl.scan_parquet(files, missing_columns="insert", extra_columns="ignore",
                           storage_options=polars_options(data_dir.root))


def polars_options(path: object) -> dict[str, str] | None:
    """The ``storage_options`` Polars needs to read ``path`` (None for a local path)."""
    if not is_remote(path):
        return None
    where = path if isinstance(path, ObjectPath) else ObjectPath.from_url(str(path))
    return where.bucket.settings.polars_options()


def parquet_source(path: str | os.PathLike[str] | ObjectPath) -> Any:
    """What pyarrow opens to read ``path``: the path itself, or the object's bytes (a raw
    segment is a few MB: one GET beats a ranged GET per footer and column chunk).

    Raises:
        FileNotFoundError: the object is gone (see :func:`retry_vanished`).
    """
    if not is_remote(path):
        return path
    where = path if isinstance(path, ObjectPath) else ObjectPath.from_url(str(path))
    return pa.BufferReader(where.read_bytes())


def read_parquet_if_exists(path: Path | ObjectPath,
                           columns: list[str] | None = None) -> pl.DataFrame | None:
    """The Parquet file at ``path``, or None when there is none (on an object store one GET,
    not a HEAD and then a GET)."""
    import polars as pl

    if not is_remote(path):
        return pl.read_parquet(path, columns=columns) if path.exists() else None
    try:
        source = parquet_source(path)
    except FileNotFoundError:
        return None
    return pl.read_parquet(source, columns=columns)


def unreadable_files(folder: Path) -> list[Path]:
    """Published Parquet files under ``folder`` whose footer cannot be read (truncated or
    overwritten outside fleetlens: atomic publishing never leaves such a file)."""
    bad = []
    for path in parquet_files(folder):
        try:
            pq.read_metadata(parquet_source(path))
        except FileNotFoundError:
            continue  # deleted meanwhile (compaction): not damaged
        except (OSError, pa.ArrowException):
            bad.append(path)
    return bad


def damaged_error(data_dir: DataDir, bad: list[Path]) -> StorageError:
    """The error for damaged files: which ones, and what to do about them."""
    shown = ", ".join(str(p.relative_to(data_dir.root)) for p in bad[:3])
    more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
    return StorageError(
        f"{len(bad)} Parquet file(s) in {data_dir.root} cannot be read (truncated or "
        f"overwritten): {shown}{more}. Move them out of the data directory (keep them for "
        "inspection) and run again; their rows are lost unless a copy exists elsewhere")
