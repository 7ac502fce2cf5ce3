"""The data directory: layout, safe partition paths, atomic Parquet publish, DuckDB readers.

Files are the interface between fleetlens processes (DESIGN.md section 2)::

    wal/                                    collector write-ahead log
    raw/{spans,metrics,logs}/date=YYYY-MM-DD/hour=HH/<writer>-<seq>.parquet
    derived/<table>/date=YYYY-MM-DD/...     pipeline and analytics outputs
    state/                                  job watermarks and manifests

Two rules keep concurrent readers safe. A Parquet file appears only complete: it is written
under a hidden ``.<name>.tmp`` name (which no ``*.parquet`` glob matches), fsynced, renamed,
and the directory fsynced. And no process shares a DuckDB database file: every reader opens
its own in-memory DuckDB with one view per table over the Parquet globs. Files do disappear
(compaction, retention), so readers go through :func:`retry_vanished`.

This module imports only :mod:`pipeline.schema`, so the collector may use it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
import secrets
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq

from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.schema.settings import (
    DEFAULT_DATA_DIR,
    ENV_DATA_DIR,
    ConfigError,
    read_config,
)

if TYPE_CHECKING:  # DuckDB and Polars only for readers: the collector never loads them (RSS)
    import duckdb
    import polars as pl

PARQUET_SUFFIX = ".parquet"
TMP_SUFFIX = ".tmp"
#: Longest partition value kept verbatim; longer ones are cut and suffixed with a hash.
MAX_COMPONENT = 120
_SAFE_CHARS = re.compile(r"[A-Za-z0-9._-]")
_NS_PER_S = 1_000_000_000
T = TypeVar("T")


class StorageError(RuntimeError):
    """A path or file operation on the data directory failed or was unsafe."""


class DataDir:
    """The layout of one fleetlens data directory (local path; object stores come later)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).expanduser().resolve()

    @classmethod
    def from_env(cls, explicit: str | os.PathLike[str] | None = None,
                 config_file: str | os.PathLike[str] | None = None) -> DataDir:
        """``explicit``, else ``$FLEETLENS_DATA``, else the config file's top-level
        ``data_dir`` (``config_file``, else ``$FLEETLENS_CONFIG``, else ``./fleetlens.toml``),
        else ``./fleetlens-data``.

        Raises:
            ConfigError: when the config file has to be read and cannot be.
        """
        chosen = explicit or os.environ.get(ENV_DATA_DIR)
        if not chosen:
            chosen = read_config(config_file).get("data_dir")
            if chosen is not None and not isinstance(chosen, str):
                raise ConfigError(f"data_dir: expected a path (a string), got {chosen!r}")
        return cls(chosen or DEFAULT_DATA_DIR)

    def require(self) -> DataDir:
        """This data directory, checked to exist as a directory (for commands that only read
        or process what is there: a mistyped path must not answer "nothing yet").

        Raises:
            StorageError: saying what is wrong and where the path came from.
        """
        if not self.root.exists():
            raise StorageError(
                f"no data directory at {self.root} (from --data-dir, ${ENV_DATA_DIR}, the "
                "config file's data_dir or the default ./fleetlens-data); the collector "
                "creates it when it starts")
        if not self.root.is_dir():
            raise StorageError(f"the data directory {self.root} is not a directory")
        return self

    @property
    def wal(self) -> Path:
        return self.root / "wal"

    @property
    def state(self) -> Path:
        return self.root / "state"

    def raw(self, signal: str) -> Path:
        """Folder of a raw signal (``spans``, ``metrics`` or ``logs``)."""
        if signal not in t.RAW_SIGNALS:
            known = ", ".join(t.RAW_SIGNALS)
            raise StorageError(f"unknown raw signal {signal!r}; expected one of {known}")
        return self.root / "raw" / signal

    def derived(self, table: str) -> Path:
        """Folder of a derived table."""
        spec = t.table(table)
        if spec.raw_signal:
            raise StorageError(f"{table!r} is a raw table; use raw({spec.raw_signal!r})")
        return self.root / "derived" / table

    def table_dir(self, table: str) -> Path:
        """Folder holding the Parquet files of any table of the contract."""
        spec = t.table(table)
        return self.raw(spec.raw_signal) if spec.raw_signal else self.derived(table)

    def raw_segment_path(self, signal: str, ts_ns: int, writer_id: str, seq: int) -> Path:
        """Path of a raw segment: ``raw/<signal>/date=.../hour=.../<writer>-<seq>.parquet``."""
        day, hour = hour_partition(ts_ns)
        name = f"{safe_component(writer_id)}-{seq:012d}{PARQUET_SUFFIX}"
        return self.inside(self.raw(signal) / f"date={day}" / f"hour={hour}" / name)

    def partition_path(self, table: str, **parts: str | int) -> Path:
        """Folder ``<table dir>/k1=v1/k2=v2`` with every value escaped by :func:`safe_component`."""
        path = self.table_dir(table)
        for key, value in parts.items():
            path = path / f"{safe_component(key)}={safe_component(str(value))}"
        return self.inside(path)

    def inside(self, path: Path) -> Path:
        """Return ``path`` if it resolves under the root, else raise :class:`StorageError`."""
        resolved = path.resolve()
        if resolved != self.root and self.root not in resolved.parents:
            raise StorageError(f"path {path} escapes the data directory {self.root}")
        return resolved


def hour_partition(ts_ns: int) -> tuple[str, str]:
    """The ``(YYYY-MM-DD, HH)`` UTC partition of a timestamp in ns."""
    moment = dt.datetime.fromtimestamp(ts_ns / _NS_PER_S, tz=dt.UTC)
    return moment.strftime("%Y-%m-%d"), moment.strftime("%H")


def safe_component(value: str) -> str:
    """Escape ``value`` into one safe path component.

    Characters outside ``[A-Za-z0-9._-]`` are percent-encoded byte by byte (UTF-8), so ``/``,
    ``\\``, NUL and ``..`` separators cannot survive; ``.`` and ``..`` alone are encoded
    whole; the empty string becomes ``%00empty``; values longer than :data:`MAX_COMPONENT`
    characters are cut and suffixed with a hash of the whole value so distinct values stay
    distinct.
    """
    if value in ("", ".", ".."):
        return {"": "%00empty", ".": "%2E", "..": "%2E%2E"}[value]
    out = []
    for ch in value:
        if _SAFE_CHARS.fullmatch(ch):
            out.append(ch)
        else:
            out.extend(f"%{byte:02X}" for byte in ch.encode("utf-8", "surrogatepass"))
    escaped = "".join(out)
    if len(escaped) > MAX_COMPONENT:
        digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        escaped = f"{escaped[: MAX_COMPONENT - 17]}~{digest}"
    return escaped


def fsync_dir(path: Path) -> None:
    """fsync a directory so a rename inside it survives power loss."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def tmp_path_for(path: Path) -> Path:
    """The hidden temporary name a file is written under before it is published."""
    return path.with_name(f".{path.name}.{secrets.token_hex(4)}{TMP_SUFFIX}")


def write_bytes_atomic(path: str | os.PathLike[str], write: Callable[[Any], None]) -> Path:
    """Publish a file at ``path`` so readers see the old file or the whole new one.

    ``write`` gets a binary handle on a hidden temporary file in the same directory; the file
    is fsynced, renamed over ``path``, and the directory is fsynced. On any error the
    temporary file is removed and the error propagates; ``path`` is never left torn. The one
    way fleetlens publishes a file (Parquet, state, provenance, heartbeats).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_path_for(target)
    try:
        with open(tmp, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)
    return target


def write_json_atomic(path: str | os.PathLike[str], data: Any, *, indent: int = 1) -> Path:
    """Publish ``data`` as JSON with sorted keys (equal data, equal bytes), atomically."""
    body = json.dumps(data, indent=indent, sort_keys=True).encode()
    return write_bytes_atomic(path, lambda handle: handle.write(body))


def write_parquet_atomic(
    frame: pl.DataFrame | pa.Table, path: str | os.PathLike[str], *, compression: str = "zstd",
    compression_level: int | None = None, **arrow_options: Any,
) -> Path:
    """Publish ``frame`` at ``path`` so readers see all of it or nothing.

    Writes a hidden temporary file in the same directory, fsyncs it, renames it over
    ``path`` and fsyncs the directory. On any error the temporary file is removed and the
    error propagates; ``path`` is never left torn. ``compression_level`` is the codec's
    default when None. ``arrow_options`` (encodings, dictionary columns) go to
    :func:`pyarrow.parquet.write_table` when ``frame`` is an Arrow table.
    """
    def write(handle: Any) -> None:
        if isinstance(frame, pa.Table):
            pq.write_table(frame, handle, compression=compression,
                           compression_level=compression_level, **arrow_options)
        else:  # Polars' own writer: 1.5-2x faster than to_arrow + pyarrow, and smaller
            frame.write_parquet(handle, compression=compression,
                                compression_level=compression_level)

    return write_bytes_atomic(path, write)


def remove_stale_tmp(root: Path) -> int:
    """Delete temporary files left by writers that died; returns how many were removed."""
    removed = 0
    for tmp in root.rglob(f".*{TMP_SUFFIX}"):
        tmp.unlink(missing_ok=True)
        removed += 1
    return removed


def parquet_files(folder: Path) -> Iterator[Path]:
    """Every published Parquet file under ``folder`` (hidden temporary files excluded)."""
    if folder.is_dir():
        files = sorted(folder.rglob(f"*{PARQUET_SUFFIX}"))
        yield from (p for p in files if not p.name.startswith("."))


def has_parquet(folder: Path) -> bool:
    """Whether ``folder`` holds a published Parquet file (stops at the first one found)."""
    for _, _, files in os.walk(folder):
        if any(f.endswith(PARQUET_SUFFIX) and not f.startswith(".") for f in files):
            return True
    return False


def existing_tables(data_dir: DataDir, among: Iterable[str] | None = None) -> list[str]:
    """Names of the contract tables (``among`` these) that have at least one Parquet file."""
    wanted = t.TABLES if among is None else set(among)
    return [name for name in t.TABLES
            if name in wanted and has_parquet(data_dir.table_dir(name))]


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
    wanted = set(t.TABLES if tables is None else tables)
    present = set(existing_tables(data_dir, wanted))
    for name in (n for n in t.TABLES if n in wanted):
        if name in present:
            glob = table_glob(data_dir, name).replace("'", "''")
            # Creating the view reads every file's schema: compaction may delete one meanwhile.
            retry_vanished(lambda glob=glob, name=name: con.execute(
                f'CREATE VIEW "{name}" AS SELECT * FROM read_parquet('
                f"'{glob}', hive_partitioning = true, union_by_name = true)"
            ))
        else:
            # A table with no data yet still answers queries, with zero rows. A real (empty)
            # table rather than a registered frame, so cursors of this connection see it too.
            empty = t.table(name).empty().to_arrow()  # noqa: F841 - read by DuckDB below
            con.execute(f'CREATE TABLE "{name}" AS SELECT * FROM empty')
    if read_only_sandbox:
        # The views read their Parquet lazily, so their folders stay readable; nothing else.
        readable = [str(data_dir.root / "raw") + os.sep, str(data_dir.root / "derived") + os.sep]
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
    return pl.scan_parquet(files, missing_columns="insert", extra_columns="ignore")


def unreadable_files(folder: Path) -> list[Path]:
    """Published Parquet files under ``folder`` whose footer cannot be read (truncated or
    overwritten outside fleetlens: atomic publishing never leaves such a file)."""
    bad = []
    for path in parquet_files(folder):
        try:
            pq.read_metadata(path)
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


#: Tries of a read that lost a file between listing and opening it (see :func:`retry_vanished`).
READ_ATTEMPTS = 4
_VANISHED = ("No such file or directory", "No files found that match the pattern")


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
