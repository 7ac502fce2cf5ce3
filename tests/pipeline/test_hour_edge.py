"""Incremental = full recompute when new data starts a new hour: the first GPU sample of the
new hour measures energy since the previous sample, part of which lies in the previous hour's
last slot, so that hour's energy and windows must be recomputed too."""

from __future__ import annotations

import hashlib
from pathlib import Path

from fleetlens.pipeline.config import PipelineConfig
from fleetlens.pipeline.runner import OUTPUTS, Pipeline
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, parquet_files
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


def _write_hour(dd: DataDir, hour: int) -> None:
    """One hour of a small fleet: a GPU sample every 30 s and a request every 5 minutes."""
    lo = T0 + hour * HOUR_NS
    points = []
    for ts in range(lo, lo + HOUR_NS, 30 * NS):
        points += gpu_points("GPU-0", ts, power=300.0, energy=300.0 * (ts - T0) / NS)
        points.append(instance_gpu_point("h1/vllm", "GPU-0", ts))
    spans = [vllm_span(1000 * hour + i, start_ns=lo + i * 300 * NS + 7 * NS, e2e=20.0)
             for i in range(12)]
    write_raw(dd, t.METRIC_POINTS, points_frame(points), seq=100 + hour)
    write_raw(dd, t.SPANS, spans_frame(spans), seq=200 + hour)


def test_phase_2_overlaps_phase_1_and_changes_nothing(tmp_path: Path, monkeypatch) -> None:
    # Short requests: phase 2 of an hour may start once phase 1 of the next one is published.
    cfg = PipelineConfig(max_request_s=60)
    events: list[tuple[str, int]] = []
    real1, real2 = Pipeline._phase1, Pipeline._phase2

    def phase1(self, state, hour):
        out = real1(self, state, hour)
        events.append(("phase 1 done", hour))
        return out

    def phase2(self, hour, *args):
        events.append(("phase 2", hour))
        return real2(self, hour, *args)

    monkeypatch.setattr(Pipeline, "_phase1", phase1)
    monkeypatch.setattr(Pipeline, "_phase2", phase2)
    full = DataDir(tmp_path / "full")
    for hour in range(5):
        _write_hour(full, hour)
    Pipeline(full, cfg).run_once()
    first_phase2 = events.index(("phase 2", T0))
    last_phase1 = max(i for i, (what, _) in enumerate(events) if what == "phase 1 done")
    assert first_phase2 < last_phase1  # the phases did overlap

    # ... and gave the files of a run that took the hours one at a time
    inc = DataDir(tmp_path / "inc")
    job = Pipeline(inc, cfg)
    for hour in range(5):
        _write_hour(inc, hour)
        job.run_once()
    assert _digest(inc) == _digest(full)
