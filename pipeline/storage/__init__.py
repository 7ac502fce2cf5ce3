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

The data directory may also be an ``s3://bucket/prefix`` URL: its root is then an
:class:`~fleetlens.pipeline.storage.objects.ObjectPath`, which answers the same path
operations, and the functions here publish with one PUT per file instead of tmp + rename
(``objects.py``). A local data directory never imports the object-store libraries.

This package imports only :mod:`pipeline.schema`, so the collector may use it.
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

if TYPE_CHECKING:  # Polars only for readers: the collector never loads it (RSS)
    import polars as pl

    from fleetlens.pipeline.storage.objects import ObjectPath

PARQUET_SUFFIX = ".parquet"
TMP_SUFFIX = ".tmp"
#: Longest partition value kept verbatim; longer ones are cut and suffixed with a hash.
MAX_COMPONENT = 120
_SAFE_CHARS = re.compile(r"[A-Za-z0-9._-]")
_NS_PER_S = 1_000_000_000
T = TypeVar("T")
#: Data directories on object storage are URLs with this scheme.
URL_SCHEME = "s3://"
#: Where a collector writing to an object store keeps its write-ahead log (a local folder).
ENV_WAL_DIR = "FLEETLENS_WAL_DIR"
DEFAULT_WAL_DIR = "fleetlens-wal"


class StorageError(RuntimeError):
    """A path or file operation on the data directory failed or was unsafe."""


def is_remote(path: object) -> bool:
    """Whether ``path`` (a path, an ``ObjectPath`` or a string) lies on an object store."""
    if isinstance(path, str):
        return path.startswith(URL_SCHEME)
    return bool(getattr(path, "remote", False))


class DataDir:
    """The layout of one fleetlens data directory: a local path or an ``s3://`` URL."""

    root: Path | ObjectPath

    def __init__(self, root: str | os.PathLike[str] | ObjectPath,
                 wal_dir: str | os.PathLike[str] | None = None) -> None:
        """``wal_dir``: the collector's write-ahead log folder (default ``<root>/wal`` for a
        local root; for an ``s3://`` root ``$FLEETLENS_WAL_DIR``, else
        ``./fleetlens-wal/<bucket>/<prefix>``: the WAL must stay on a local disk).

        Raises:
            StorageError: a malformed ``s3://`` URL.
        """
        text = root if isinstance(root, str) else str(root)
        self._wal = Path(wal_dir).expanduser().resolve() if wal_dir else None
        if not is_remote(text):
            self.root = Path(root).expanduser().resolve()  # type: ignore[arg-type]
            return
        from fleetlens.pipeline.storage.objects import ObjectPath

        try:
            self.root = ObjectPath.from_url(text)
        except ValueError as exc:
            raise StorageError(f"data directory: {exc}") from None
        if self._wal is None:
            where = os.environ.get(ENV_WAL_DIR) or Path(
                DEFAULT_WAL_DIR, self.root.bucket.name, *self.root.parts)
            self._wal = Path(where).expanduser().resolve()

    @property
    def remote(self) -> bool:
        """Whether the data lives on an object store (the WAL never does)."""
        return is_remote(self.root)

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
        if is_remote(self.root):
            return self._require_bucket()
        if not self.root.exists():
            raise StorageError(
                f"no data directory at {self.root} (from --data-dir, ${ENV_DATA_DIR}, the "
                "config file's data_dir or the default ./fleetlens-data); the collector "
                "creates it when it starts")
        if not self.root.is_dir():
            raise StorageError(f"the data directory {self.root} is not a directory")
        return self

    def _require_bucket(self) -> DataDir:
        # One LIST: a missing bucket, bad credentials or an unreachable endpoint fail here
        # with their cause, not later as "no data yet". An empty prefix is a new data
        # directory (object stores have no folders to create).
        try:
            self.root.is_dir()
        except OSError as exc:
            raise StorageError(f"cannot read the data directory {self.root}: {exc}") from None
        return self

    @property
    def wal(self) -> Path:
        return self._wal if self._wal is not None else self.root / "wal"  # type: ignore[return-value]

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
        if is_remote(path):  # object keys are normalised (no '..') when the path is made
            if not path.is_relative_to(self.root):  # type: ignore[arg-type]
                raise StorageError(f"path {path} escapes the data directory {self.root}")
            return path
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
    if is_remote(path):
        return _put_whole(path, write)  # type: ignore[arg-type]
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


def _put_whole(path: ObjectPath, write: Callable[[Any], None]) -> ObjectPath:
    """The object-store publish: encode in memory, then one PUT, which S3 makes visible
    whole or not at all (so no temporary name, and nothing to clean up after a crash)."""
    import io

    buffer = io.BytesIO()
    write(buffer)
    path.write_bytes(buffer.getvalue())
    return path


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
    if is_remote(root):
        return 0  # a PUT leaves no temporary object behind
    removed = 0
    for tmp in root.rglob(f".*{TMP_SUFFIX}"):
        tmp.unlink(missing_ok=True)
        removed += 1
    return removed


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


# The readers live in their own module; every name stays importable from here.
from fleetlens.pipeline.storage.readers import (  # noqa: E402
    connect,
    damaged_error,
    parquet_source,
    polars_options,
    read_parquet_if_exists,
    scan,
    table_glob,
    tables_named_in,
    unreadable_files,
)

__all__ = [
    "DEFAULT_WAL_DIR", "ENV_WAL_DIR", "MAX_COMPONENT", "PARQUET_SUFFIX", "READ_ATTEMPTS",
    "TMP_SUFFIX", "URL_SCHEME", "DataDir", "StorageError", "connect", "damaged_error",
    "existing_tables", "fsync_dir", "has_parquet", "hour_partition", "is_remote",
    "is_vanished_file", "parquet_files", "parquet_source", "polars_options",
    "read_parquet_if_exists", "remove_stale_tmp", "remove_tree", "retry_vanished", "safe_component",
    "scan", "table_glob", "tables_named_in", "tmp_path_for", "unreadable_files",
    "write_bytes_atomic", "write_json_atomic", "write_parquet_atomic",
]
