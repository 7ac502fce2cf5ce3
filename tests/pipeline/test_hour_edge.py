"""Incremental = full recompute when new data starts a new hour: the first GPU sample of the
new hour measures energy since the previous sample, part of which lies in the previous hour's
last slot, so that hour's energy and windows must be recomputed too."""

from __future__ import annotations

import hashlib
from pathlib import Path

from pipeline.config import PipelineConfig
from pipeline.runner import OUTPUTS, Pipeline
from pipeline.schema import tables as t
from pipeline.storage import DataDir, parquet_files
from tests.pipeline.rawdata import (
    HOUR_NS,
    NS,
    T0,
    gpu_points,
    instance_gpu_point,
    points_frame,
    spans_frame,
    vllm_span,
    write_raw,
)

EDGE = T0 + HOUR_NS  # the hour boundary the data crosses
STEP = 4 * NS  # GPU sample interval: the sample at EDGE + 2 s covers (EDGE - 2 s, EDGE + 2 s]


def _points(lo: int, hi: int) -> list[dict]:
    rows = []
    for ts in range(lo, hi, STEP):
        rows += gpu_points("GPU-0", ts, power=300.0, energy=300.0 * (ts - T0) / NS)
        rows.append(instance_gpu_point("h1/vllm", "GPU-0", ts))
    return rows


def _write(dd: DataDir, part: int) -> None:
    """Part 0: the hour before EDGE (samples up to EDGE - 2 s, requests up to EDGE - 1 s);
    part 1: everything after (first sample EDGE + 2 s)."""
    if part == 0:
        points = _points(EDGE - 120 * NS - 2 * NS, EDGE)
        spans = [vllm_span(i, start_ns=EDGE - 60 * NS + i * 5 * NS, e2e=4.0) for i in range(12)]
    else:
        points = _points(EDGE + 2 * NS, EDGE + 120 * NS)
        spans = [vllm_span(100 + i, start_ns=EDGE + i * 5 * NS, e2e=4.0) for i in range(12)]
    write_raw(dd, t.METRIC_POINTS, points_frame(points), seq=10 + part)
    write_raw(dd, t.SPANS, spans_frame(spans), seq=20 + part)


def _digest(dd: DataDir) -> dict[str, str]:
    return {str(p.relative_to(dd.root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for table in OUTPUTS for p in parquet_files(dd.derived(table))}


def test_new_hour_recomputes_the_energy_of_the_previous_hours_last_slot(tmp_path: Path) -> None:
    full = DataDir(tmp_path / "full")
    _write(full, 0)
    _write(full, 1)
    Pipeline(full, PipelineConfig()).run_once()

    inc = DataDir(tmp_path / "inc")
    job = Pipeline(inc, PipelineConfig())
    _write(inc, 0)
    job.run_once()
    _write(inc, 1)
    summary = job.run_once()
    assert summary.dirty_hours == 2  # the new hour, and the previous one for its energy
    assert _digest(inc) == _digest(full)
