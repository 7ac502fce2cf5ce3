"""The data directory: layout, safe partition paths, atomic publish, DuckDB and Polars readers,
on a local disk or on S3-compatible object storage.

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
:class:`ObjectPath`, which answers the same path operations, and the functions here publish
with one PUT per file instead of tmp + rename. A local data directory takes the same code
paths as before and never imports the object-store libraries (obstore, s3fs: imported inside
the functions that use them).

The sections, in order: the local layout and publishing; the readers; S3 settings; objects.
One module rather than a package because the import rule lets the collector import this
module and the schema only (tests/test_import_rules.py), and a package would be a new entry
in pyproject.toml's package list.

This module imports only :mod:`pipeline.schema`, so the collector may use it.
"""

from __future__ import annotations

import configparser
import datetime as dt
import fnmatch
import functools
import hashlib
import json
import os
import re
import secrets
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
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


# -- S3 settings -----------------------------------------------------------------------

# Where an ``s3://`` data directory is and how to sign requests to it.
#
# Resolved the way the AWS tools do, so an operator configures fleetlens like the ``aws`` CLI:
# the environment first (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``,
# ``AWS_REGION``/``AWS_DEFAULT_REGION``, ``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL`` for MinIO and
# other S3-compatible servers), then the shared files (``AWS_SHARED_CREDENTIALS_FILE``, default
# ``~/.aws/credentials``, and ``AWS_CONFIG_FILE``, default ``~/.aws/config``) for the profile
# ``AWS_PROFILE`` (default ``default``). Nothing here talks to the network.
#
# One resolved :class:`S3Settings` feeds all three clients that touch the store, so they cannot
# disagree: obstore (listing, publishing, state and lease objects), Polars (``storage_options``)
# and, for DuckDB only, an s3fs filesystem registered with the connection. :func:`export` also
# puts what came from the files into this process's environment (never over a variable that is
# set), for the few Polars reads that take plain ``s3://`` strings from ``parquet_files``.

DEFAULT_REGION = "us-east-1"


@dataclass(frozen=True)
class S3Settings:
    """Endpoint, region and credentials of one bucket (None: let the client find them)."""

    bucket: str
    region: str
    endpoint: str | None = None
    key_id: str | None = None
    secret: str | None = None
    token: str | None = None

    @property
    def allow_http(self) -> bool:
        """Plain HTTP only when the endpoint says so (a local MinIO or test server)."""
        return bool(self.endpoint and self.endpoint.startswith("http://"))

    def obstore_config(self) -> dict[str, object]:
        """Keyword arguments of ``obstore.store.S3Store``."""
        out: dict[str, object] = {"region": self.region}
        if self.endpoint:
            out["endpoint"] = self.endpoint
            # MinIO and moto serve path-style URLs; virtual-hosted names need DNS.
            out["virtual_hosted_style_request"] = False
        if self.allow_http:
            out["client_options"] = {"allow_http": True}
        if self.key_id and self.secret:
            out["access_key_id"] = self.key_id
            out["secret_access_key"] = self.secret
            if self.token:
                out["session_token"] = self.token
        return out

    def polars_options(self) -> dict[str, str]:
        """``storage_options`` for Polars' native object-store reader."""
        out = {"aws_region": self.region}
        if self.endpoint:
            out["aws_endpoint_url"] = self.endpoint
            out["aws_virtual_hosted_style_request"] = "false"
        if self.allow_http:
            out["aws_allow_http"] = "true"
        if self.key_id and self.secret:
            out["aws_access_key_id"] = self.key_id
            out["aws_secret_access_key"] = self.secret
            if self.token:
                out["aws_session_token"] = self.token
        return out

    def s3fs_options(self) -> dict[str, object]:
        """Keyword arguments of ``s3fs.S3FileSystem`` (DuckDB's registered filesystem)."""
        out: dict[str, object] = {
            "client_kwargs": {"region_name": self.region},
            # Readers must see objects published after they connected: no listing cache.
            "use_listings_cache": False, "skip_instance_cache": True,
        }
        if self.endpoint:
            out["endpoint_url"] = self.endpoint
        if self.key_id and self.secret:
            out.update(key=self.key_id, secret=self.secret, token=self.token)
        return out


def split_url(url: str) -> tuple[str, str]:
    """``s3://bucket/a/b/`` -> ``("bucket", "a/b")``.

    Raises:
        ValueError: not an ``s3://`` URL with a bucket name, or a ``.``/``..`` component.
    """
    if not url.startswith(URL_SCHEME):
        raise ValueError(f"{url!r} is not an {URL_SCHEME} URL")
    bucket, _, prefix = url[len(URL_SCHEME):].partition("/")
    if not bucket:
        raise ValueError(f"{url!r} names no bucket (expected s3://BUCKET[/PREFIX])")
    parts = [p for p in prefix.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise ValueError(f"{url!r}: '.' and '..' are not allowed in an object prefix")
    return bucket, "/".join(parts)


def _profile_section(path: Path, section: str) -> dict[str, str]:
    if not path.is_file():
        return {}
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path)
    except configparser.Error:
        return {}  # a damaged AWS file: the environment may still be enough
    return dict(parser[section]) if parser.has_section(section) else {}


def resolve_s3_settings(bucket: str, env: dict[str, str] | None = None) -> S3Settings:
    """The settings of ``bucket`` from the environment and the AWS shared files."""
    env = dict(os.environ if env is None else env)
    profile = env.get("AWS_PROFILE") or "default"
    home = Path(env.get("HOME") or Path.home())
    creds = _profile_section(
        Path(env.get("AWS_SHARED_CREDENTIALS_FILE") or home / ".aws" / "credentials"), profile)
    conf = _profile_section(Path(env.get("AWS_CONFIG_FILE") or home / ".aws" / "config"),
                            profile if profile == "default" else f"profile {profile}")
    key_id, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
    token = env.get("AWS_SESSION_TOKEN")
    if not (key_id and secret):
        key_id, secret = creds.get("aws_access_key_id"), creds.get("aws_secret_access_key")
        token = creds.get("aws_session_token")
    region = (env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or conf.get("region")
              or DEFAULT_REGION)
    endpoint = (env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
                or conf.get("endpoint_url"))
    return S3Settings(bucket, region, endpoint or None, key_id or None, secret or None,
                      token or None)


def export_s3_settings(settings: S3Settings, env: dict[str, str] | None = None) -> None:
    """Set the standard AWS variables of ``settings`` that the environment lacks."""
    target = os.environ if env is None else env
    wanted = {"AWS_REGION": settings.region, "AWS_ENDPOINT_URL": settings.endpoint,
              "AWS_ALLOW_HTTP": "true" if settings.allow_http else None,
              "AWS_ACCESS_KEY_ID": settings.key_id, "AWS_SECRET_ACCESS_KEY": settings.secret,
              "AWS_SESSION_TOKEN": settings.token}
    if target.get("AWS_ACCESS_KEY_ID"):  # never mix a key id from one place, a secret from another
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
            wanted.pop(key)
    for key, value in wanted.items():
        if value and not target.get(key):
            target[key] = value


# -- objects ---------------------------------------------------------------------------

# A data directory on S3-compatible object storage: :class:`ObjectPath`, a path on a bucket.
#
# :class:`ObjectPath` answers the part of :class:`pathlib.Path` that fleetlens uses on its data
# directory (``/``, ``name``, ``parent``, ``relative_to``, ``exists``, ``stat``, ``glob``,
# ``read_bytes``, ``unlink``...), so the code above the storage layer does not care where the
# data is. What differs underneath:
#
# * Publishing is one PUT of the whole object: S3 never shows a partial object, so no temporary
#   name and no rename are needed (a rename is a copy and a delete there, not atomic).
# * Folders do not exist: ``mkdir`` does nothing, a folder "exists" while an object is under it.
# * A listing carries each object's size and time, so :meth:`ObjectPath.stat` of a listed path
#   costs no request (discovery stats every raw segment).
# * Versioned writes (:meth:`ObjectPath.read_versioned`, :meth:`ObjectPath.put_if`) are S3's
#   conditional PUT (``If-None-Match: *`` to create, ``If-Match: <etag>`` to replace): the state
#   files and the job lease use them so that two writers cannot overwrite each other unseen.
#
# obstore does the requests (measured against s3fs in docs/benchmarks.md); it is imported only
# when an ``s3://`` data directory is opened, so a local data directory never loads it.

class ObjectStoreError(OSError):
    """A request to the object store failed (network, permissions, server): an I/O error,
    so callers that retry a failed publish on ``OSError`` retry this too."""


class VersionConflict(ObjectStoreError):
    """A conditional write lost: the object changed (or appeared) since it was read."""


@dataclass(frozen=True)
class ObjectStat:
    """What ``os.stat_result`` fields fleetlens reads, for an object."""

    st_size: int
    st_mtime: float

    @property
    def st_mtime_ns(self) -> int:
        return int(self.st_mtime * 1e9)


class Bucket:
    """One bucket's obstore client (thread-safe) and its request count."""

    def __init__(self, settings: S3Settings) -> None:
        from obstore.store import S3Store

        self.settings = settings
        self.name = settings.bucket
        self.store = S3Store(settings.bucket, **settings.obstore_config())  # type: ignore[arg-type]
        self.requests = 0
        self._count_lock = threading.Lock()
        self._fs: Any = None

    def _count(self) -> None:
        with self._count_lock:
            self.requests += 1

    def get(self, key: str) -> tuple[bytes, str | None]:
        """The object's bytes and ETag. Raises FileNotFoundError when there is none."""
        import obstore

        self._count()
        with _mapped(key):
            result = obstore.get(self.store, key)
            return bytes(result.bytes()), result.meta.get("e_tag")

    def head(self, key: str) -> dict[str, Any]:
        import obstore

        self._count()
        with _mapped(key):
            return dict(obstore.head(self.store, key))

    def put(self, key: str, data: bytes, mode: Any = None) -> str | None:
        """One PUT; ``mode`` is obstore's (``"create"``, ``{"e_tag": ...}``). Returns the ETag."""
        import obstore

        self._count()
        with _mapped(key):
            result = obstore.put(self.store, key, data, mode=mode or "overwrite")
        return result.get("e_tag")

    def delete(self, keys: list[str]) -> None:
        import obstore

        for start in range(0, len(keys), 1000):  # S3's DeleteObjects takes 1,000 keys
            self._count()
            with _mapped(keys[start] if keys else ""):
                obstore.delete(self.store, keys[start:start + 1000])

    def list(self, prefix: str) -> Iterator[dict[str, Any]]:
        """Every object under ``prefix`` (a folder: ends with ``/``), page by page."""
        import obstore

        stream = obstore.list(self.store, prefix or None, chunk_size=1000)
        while True:
            self._count()
            with _mapped(prefix):
                try:
                    chunk = next(stream)
                except StopIteration:
                    return
            yield from chunk

    def filesystem(self) -> Any:
        """An s3fs filesystem on the same settings, for DuckDB's ``register_filesystem``
        (obstore's fsspec adapter fails on S3 options in 0.12, see docs/benchmarks.md)."""
        if self._fs is None:
            import s3fs

            self._fs = s3fs.S3FileSystem(**self.settings.s3fs_options())
        return self._fs


class _mapped:
    """Turn obstore's errors into the OSErrors the rest of fleetlens handles."""

    def __init__(self, key: str) -> None:
        self.key = key

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 _tb: Any) -> bool:
        if error is None or isinstance(error, FileNotFoundError | ObjectStoreError):
            return False  # obstore's NotFoundError is already a FileNotFoundError
        import obstore.exceptions as ox

        if isinstance(error, ox.AlreadyExistsError | ox.PreconditionError):
            raise VersionConflict(f"{self.key}: changed by another writer") from None
        if isinstance(error, ox.BaseError):
            first = str(error).split("\n", 1)[0]
            raise ObjectStoreError(f"object store request failed: {first}") from None
        return False


@functools.cache
def bucket_client(name: str) -> Bucket:
    """The process's client of bucket ``name`` (settings resolved once, from the environment
    and the AWS files, and exported to the environment for libraries that read it)."""
    settings = resolve_s3_settings(name)
    export_s3_settings(settings)
    return Bucket(settings)


class ObjectPath:
    """A path in a bucket: ``s3://bucket/key``. Keys have no leading or trailing ``/``."""

    remote = True
    __slots__ = ("bucket", "key", "_stat", "_folder_known")

    def __init__(self, where: Bucket, key: str, stat: ObjectStat | None = None,
                 folder: bool | None = None) -> None:
        self.bucket = where
        self.key = key
        self._stat = stat
        #: Whether a listing found this path as a folder (True) or an object (False).
        self._folder_known = True if folder else (False if stat is not None else None)

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        # Pickled as bucket name and key (a Ray task gets the DataDir): the client, its locks
        # and connections stay here, and the other process opens its own from its settings.
        return _object_path, (self.bucket.name, self.key)

    @classmethod
    def from_url(cls, url: str) -> ObjectPath:
        """The path of an ``s3://bucket/prefix`` URL.

        Raises:
            ValueError: a malformed URL (see :func:`split_url`).
        """
        name, key = split_url(url)
        return cls(bucket_client(name), key)

    # -- pure path operations ------------------------------------------------------------
    def __str__(self) -> str:
        return f"{URL_SCHEME}{self.bucket.name}/{self.key}".rstrip("/")

    def __repr__(self) -> str:
        return f"ObjectPath({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectPath) and str(self) == str(other)

    def __hash__(self) -> int:
        return hash(str(self))

    def __lt__(self, other: ObjectPath) -> bool:
        return self.parts < other.parts  # by component, as pathlib sorts

    def __truediv__(self, other: str | PurePosixPath) -> ObjectPath:
        parts = [p for p in str(other).split("/") if p]
        if any(p in (".", "..") for p in parts):
            raise ValueError(f"'.' and '..' are not allowed in an object key: {other}")
        return ObjectPath(self.bucket, "/".join(filter(None, [self.key, *parts])))

    @property
    def parts(self) -> tuple[str, ...]:
        return tuple(p for p in self.key.split("/") if p)

    @property
    def name(self) -> str:
        return self.key.rpartition("/")[2]

    @property
    def suffix(self) -> str:
        return PurePosixPath(self.name).suffix

    @property
    def parent(self) -> ObjectPath:
        return ObjectPath(self.bucket, self.key.rpartition("/")[0])

    def with_name(self, name: str) -> ObjectPath:
        return self.parent / name

    def relative_to(self, other: ObjectPath) -> PurePosixPath:
        if other.key and not (self.key == other.key or self.key.startswith(other.key + "/")):
            raise ValueError(f"{self} is not under {other}")
        return PurePosixPath(self.key[len(other.key):].lstrip("/") or ".")

    def is_relative_to(self, other: ObjectPath) -> bool:
        try:
            self.relative_to(other)
        except ValueError:
            return False
        return self.bucket.name == other.bucket.name

    def resolve(self) -> ObjectPath:
        return self  # keys are normalised when made

    def expanduser(self) -> ObjectPath:
        return self

    # -- requests ------------------------------------------------------------------------
    def _folder(self) -> str:
        return f"{self.key}/" if self.key else ""

    def stat(self) -> ObjectStat:
        """Size and time: from the listing that found this path, else one HEAD.

        Raises:
            FileNotFoundError: no such object.
        """
        if self._stat is None:
            meta = self.bucket.head(self.key)
            self._stat = ObjectStat(int(meta["size"]), meta["last_modified"].timestamp())
        return self._stat

    def is_file(self) -> bool:
        try:
            self.stat()
        except FileNotFoundError:
            return False
        return True

    def is_dir(self) -> bool:
        """Whether any object lies under this path (folders exist only through objects)."""
        if self._folder_known is not None:
            return self._folder_known
        return next(self.bucket.list(self._folder()), None) is not None

    def exists(self) -> bool:
        return self.is_file() or self.is_dir()

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        """Nothing to do: a folder appears with its first object."""

    def read_bytes(self) -> bytes:
        return self.bucket.get(self.key)[0]

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)

    def write_bytes(self, data: bytes) -> int:
        """Publish ``data`` with one PUT (readers see the old object or the whole new one)."""
        self.bucket.put(self.key, data)
        import time

        self._stat = ObjectStat(len(data), time.time())  # what a HEAD would say, unasked
        return len(data)

    def read_versioned(self) -> tuple[bytes, str | None]:
        """The bytes and the version (ETag) to pass to :meth:`put_if`."""
        return self.bucket.get(self.key)

    def current_version(self) -> str | None:
        """The object's version now (one HEAD), None when there is no object."""
        try:
            return self.bucket.head(self.key).get("e_tag")
        except FileNotFoundError:
            return None

    def put_if(self, data: bytes, version: str | None) -> str | None:
        """PUT only if the object is still at ``version`` (None: only if there is none).

        Returns:
            The new version.
        Raises:
            VersionConflict: another writer changed or created it first.
        """
        mode = "create" if version is None else {"e_tag": version}
        new = self.bucket.put(self.key, data, mode=mode)
        self._stat = None
        return new

    def unlink(self, missing_ok: bool = False) -> None:
        if not missing_ok:
            self.stat()  # FileNotFoundError as for a file (S3's DELETE of nothing succeeds)
        self.bucket.delete([self.key])
        self._stat = None  # gone: the next stat asks the store

    def files(self) -> Iterator[ObjectPath]:
        """Every object under this folder, with its size and time (no further request)."""
        for meta in self.bucket.list(self._folder()):
            stat = ObjectStat(int(meta["size"]), meta["last_modified"].timestamp())
            yield ObjectPath(self.bucket, meta["path"], stat)

    def remove_tree(self) -> int:
        """Delete every object under this folder; returns how many."""
        keys = [p.key for p in self.files()]
        if keys:
            self.bucket.delete(keys)
        return len(keys)

    def glob(self, pattern: str) -> Iterator[ObjectPath]:
        """Objects and folders under this one matching ``pattern`` (``*``, ``**``), sorted."""
        wanted = [p for p in pattern.split("/") if p]
        found: dict[str, ObjectPath] = {}
        for obj in self.files():
            rel = obj.relative_to(self).parts
            for depth in range(1, len(rel) + 1):
                if _match(rel[:depth], wanted):
                    key = "/".join([*self.parts, *rel[:depth]])
                    found.setdefault(key, obj if depth == len(rel)
                                     else ObjectPath(self.bucket, key, folder=True))
        return iter(sorted(found.values()))

    def rglob(self, pattern: str) -> Iterator[ObjectPath]:
        return self.glob(f"**/{pattern}")

    def iterdir(self) -> Iterator[ObjectPath]:
        return self.glob("*")


def _object_path(bucket: str, key: str) -> ObjectPath:
    """An unpickled :class:`ObjectPath`: this process's client of the bucket."""
    return ObjectPath(bucket_client(bucket), key)


def _match(parts: tuple[str, ...], pattern: list[str]) -> bool:
    """Whether path ``parts`` match glob ``pattern`` components (``**``: any depth)."""
    if not pattern:
        return not parts
    if pattern[0] == "**":
        return any(_match(parts[i:], pattern[1:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], pattern[0]) and _match(
        parts[1:], pattern[1:])
