"""Phase 2 of the local runner reads each hour's ``requests`` partition once per run (issue 17):
each hour also reads the hour before it for requests running into it, and used to read it
again from the file."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from fleetlens.pipeline import partitions
from fleetlens.pipeline.config import PipelineConfig
from fleetlens.pipeline.runner import Pipeline
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir
from tests.pipeline.fleet import make_fleet, write_batches


def test_each_requests_partition_is_read_once_per_run(tmp_path: Path, monkeypatch) -> None:
    reads: Counter[str] = Counter()
    real = partitions.read_parquet_if_exists

    def counting(path, columns=None):
        frame = real(path, columns)
        if f"/{t.REQUESTS}/" in str(path) and frame is not None:  # (a missing one: a stat)
            reads[str(path)] += 1
        return frame

    monkeypatch.setattr(partitions, "read_parquet_if_exists", counting)
    dd = DataDir(tmp_path / "data")
    # three hours of requests (from 50 min into the first)
    write_batches(dd, make_fleet(seconds=5000, rps=0.5))
    job = Pipeline(dd, PipelineConfig())
    job.run_once()
    assert len(reads) == 3 and set(reads.values()) == {1}, sorted(reads.items())
    # a second run trusts nothing the first read: a full recompute reads them again, once
    reads.clear()
    job.run_once(full=True)
    assert len(reads) == 3 and set(reads.values()) == {1}, sorted(reads.items())
