"""Names every part of the storage layer shares: constants, the error, ``is_remote``."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:  # DuckDB and Polars only for readers: the collector never loads them (RSS)
    pass


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
