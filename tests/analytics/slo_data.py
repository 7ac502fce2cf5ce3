"""A data directory holding `requests` with known failures, and a fleetlens.toml with SLOs."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from fleetlens.pipeline.schema import conform
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, write_parquet_atomic

SLOS = """
[analytics.slos]
period_days = 3

[[analytics.slos.services]]
service = "svc"
availability = 0.999
latency = [{metric = "ttft", threshold_s = 1.0, objective = 0.99}]
"""


def write_requests(root: DataDir, frame: pl.DataFrame, name: str = "slo.parquet") -> None:
    """Publish ``frame`` (all of one UTC date) as the pipeline would."""
    write_parquet_atomic(conform(frame, t.REQUESTS),
                         root.partition_path(t.REQUESTS, date="2026-01-01") / name)


def config_file(folder: Path, analytics: str = "") -> Path:
    """A fleetlens.toml with ``analytics`` lines in [analytics] and the SLOs above."""
    path = folder / "fleetlens.toml"
    path.write_text(f"[analytics]\n{analytics}\n{SLOS}")
    return path
