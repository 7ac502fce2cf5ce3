"""Provenance of an analysis: what data it saw, so a report can be checked and reproduced."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import polars as pl

from fleetlens.analytics.analyse import Analysis
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import (  # noqa: F401 - write_json_atomic re-exported
    DataDir,
    parquet_files,
    scan,
    write_json_atomic,
)

INPUT_TABLES = (t.WINDOWS, t.REQUESTS, t.ENGINE_SAMPLES, t.GPU_SAMPLES, t.INSTANCE_GPUS)


def version() -> str:
    """The installed fleetlens version ("unknown" when run from an uninstalled tree)."""
    try:
        return metadata.version("fleetlens")
    except metadata.PackageNotFoundError:
        return "unknown"


def input_hash(data_dir: DataDir) -> str:
    """sha256 over every input file's relative path, size and modification time."""
    digest = hashlib.sha256()
    for table in INPUT_TABLES:
        for path in parquet_files(data_dir.table_dir(table)):
            info = path.stat()
            rel = path.relative_to(data_dir.root)
            digest.update(f"{rel}\0{info.st_size}\0{info.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _iso(ns: int | None) -> str | None:
    if ns is None:
        return None
    return dt.datetime.fromtimestamp(ns / 1e9, tz=dt.UTC).isoformat().replace("+00:00", "Z")


def provenance(data_dir: DataDir, analysis: Analysis) -> dict[str, Any]:
    """The provenance record of one analysis of ``data_dir``."""
    banded = analysis.banded
    lo = int(banded[c.TS_NS].min()) if banded.height else None
    hi = int(banded[c.TS_NS].max()) if banded.height else None
    counts = {table: scan(data_dir, table).select(pl.len()).collect().item()
              for table in INPUT_TABLES}
    return {
        "fleetlens_version": version(),
        "computed_at": _iso(time.time_ns()),
        "data_dir": str(data_dir.root),
        "data_range": {"start": _iso(lo), "end": _iso(hi), c.START_NS: lo, c.END_NS: hi},
        c.WINDOW_S: analysis.window_s,
        "row_counts": counts,
        "series": int(banded[c.SERIES].n_unique()) if banded.height else 0,
        "incidents": analysis.incidents.height,
        "causes": analysis.causes.height,
        "input_sha256": input_hash(data_dir),
    }




def read_json(path: Path, default: Any) -> Any:
    """A JSON state file, or ``default`` when it does not exist yet."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return default
