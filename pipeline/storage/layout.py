"""The layout of a data directory (:class:`DataDir`) and safe partition paths."""

from __future__ import annotations

import datetime as dt
import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.schema.settings import (
    DEFAULT_DATA_DIR,
    ENV_DATA_DIR,
    ConfigError,
    read_config,
)

if TYPE_CHECKING:  # DuckDB and Polars only for readers: the collector never loads them (RSS)
    pass
from fleetlens.pipeline.storage.base import (
    _NS_PER_S,
    _SAFE_CHARS,
    DEFAULT_WAL_DIR,
    ENV_WAL_DIR,
    MAX_COMPONENT,
    PARQUET_SUFFIX,
    StorageError,
    is_remote,
)
from fleetlens.pipeline.storage.objects import ObjectPath


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
