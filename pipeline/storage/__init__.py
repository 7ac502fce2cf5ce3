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

Modules, each importing only those before it: ``base`` (shared names), ``fence`` (no publish
after a lost job lease), ``s3settings`` (endpoint and credentials), ``objects``
(:class:`ObjectPath` on a bucket), ``layout`` (:class:`DataDir`, partition paths), ``publish``
(atomic writes), ``readers`` (listings, DuckDB, Polars). Everything public is importable
from here, the one storage API.

This package imports only :mod:`pipeline.schema`, so the collector may use it.
"""

from fleetlens.pipeline.storage.base import (
    DEFAULT_WAL_DIR,
    ENV_WAL_DIR,
    MAX_COMPONENT,
    PARQUET_SUFFIX,
    TMP_SUFFIX,
    URL_SCHEME,
    StorageError,
    T,
    is_remote,
)
from fleetlens.pipeline.storage.fence import LeaseLost
from fleetlens.pipeline.storage.layout import (
    DataDir,
    hour_partition,
    safe_component,
)
from fleetlens.pipeline.storage.objects import (
    Bucket,
    ObjectPath,
    ObjectStat,
    ObjectStoreError,
    VersionConflict,
    bucket_client,
)
from fleetlens.pipeline.storage.publish import (
    fsync_dir,
    remove_stale_tmp,
    tmp_path_for,
    write_bytes_atomic,
    write_json_atomic,
    write_parquet_atomic,
)
from fleetlens.pipeline.storage.readers import (
    READ_ATTEMPTS,
    connect,
    damaged_error,
    existing_tables,
    has_parquet,
    is_vanished_file,
    parquet_files,
    parquet_source,
    polars_options,
    read_parquet_if_exists,
    remove_tree,
    retry_vanished,
    scan,
    table_glob,
    tables_named_in,
    unreadable_files,
)
from fleetlens.pipeline.storage.s3settings import (
    DEFAULT_REGION,
    S3Settings,
    export_s3_settings,
    resolve_s3_settings,
    split_url,
)

__all__ = [
    "Bucket",
    "DEFAULT_REGION",
    "DEFAULT_WAL_DIR",
    "DataDir",
    "ENV_WAL_DIR",
    "LeaseLost",
    "MAX_COMPONENT",
    "ObjectPath",
    "ObjectStat",
    "ObjectStoreError",
    "PARQUET_SUFFIX",
    "READ_ATTEMPTS",
    "S3Settings",
    "StorageError",
    "T",
    "TMP_SUFFIX",
    "URL_SCHEME",
    "VersionConflict",
    "bucket_client",
    "connect",
    "damaged_error",
    "existing_tables",
    "export_s3_settings",
    "fsync_dir",
    "has_parquet",
    "hour_partition",
    "is_remote",
    "is_vanished_file",
    "parquet_files",
    "parquet_source",
    "polars_options",
    "read_parquet_if_exists",
    "remove_stale_tmp",
    "remove_tree",
    "resolve_s3_settings",
    "retry_vanished",
    "safe_component",
    "scan",
    "split_url",
    "table_glob",
    "tables_named_in",
    "tmp_path_for",
    "unreadable_files",
    "write_bytes_atomic",
    "write_json_atomic",
    "write_parquet_atomic",
]
