"""Phase 2 of the local runner reads no ``requests`` partition that phase 1 published in the
same run (issue 17): phase 1 hands the frame over. Partitions of hours phase 1 did not redo
(an incremental run) are read from their files, each once per run: each hour also reads the
hour before it for requests running into it, and used to read it again from the file."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import polars as pl
import pytest

from fleetlens.pipeline import partitions
from fleetlens.pipeline import runner as runner_module
from fleetlens.pipeline.config import PipelineConfig
from fleetlens.pipeline.runner import Pipeline
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir
from tests.pipeline.fleet import make_fleet, write_batches


@pytest.fixture
def traced(monkeypatch) -> tuple[Counter[str], Counter[str]]:
    """(reads, publishes) of requests partitions, by path, with frames that exist."""
    reads: Counter[str] = Counter()
    published: Counter[str] = Counter()
    real_read, real_publish = partitions.read_parquet_if_exists, runner_module.publish

    def counting(path, columns=None):
        frame = real_read(path, columns)
        if f"/{t.REQUESTS}/" in str(path) and frame is not None:  # (a missing one: a stat)
            reads[str(path)] += 1
        return frame

    def publishing(dd: DataDir, table: str, hour: int, frame: pl.DataFrame) -> int:
        if table == t.REQUESTS and frame.height:
            published[str(partitions.partition_file(dd, table, hour))] += 1
        return real_publish(dd, table, hour, frame)

    monkeypatch.setattr(partitions, "read_parquet_if_exists", counting)
    monkeypatch.setattr(runner_module, "publish", publishing)
    return reads, published


def test_phase2_reads_no_requests_partition_phase1_just_published(
        tmp_path: Path, traced: tuple[Counter[str], Counter[str]]) -> None:
    reads, published = traced
    dd = DataDir(tmp_path / "data")
    # three hours of requests (from 50 min into the first)
    write_batches(dd, make_fleet(seconds=5000, rps=0.5))
    job = Pipeline(dd, PipelineConfig())
    job.run_once()
    assert len(published) == 3 and not reads, (sorted(published), sorted(reads.items()))
    # a second run trusts nothing the first read: a full recompute hands them over again
    published.clear()
    job.run_once(full=True)
    assert len(published) == 3 and not reads, (sorted(published), sorted(reads.items()))


def test_an_incremental_run_reads_the_clean_hours_once(
        tmp_path: Path, traced: tuple[Counter[str], Counter[str]]) -> None:
    reads, published = traced
    dd = DataDir(tmp_path / "data")
    fleet = make_fleet(seconds=5000, rps=0.5)
    write_batches(dd, fleet, range(3))
    job = Pipeline(dd, PipelineConfig())
    job.run_once()
    reads.clear()
    published.clear()
    write_batches(dd, fleet, range(3, 4))  # the last quarter: the later hours only
    job.run_once()
    # phase 2 of the first redone hour reads the clean hour before it, from its file, once
    assert published and reads, (sorted(published), sorted(reads.items()))
    assert not set(reads) & set(published), (sorted(published), sorted(reads.items()))
    assert set(reads.values()) == {1}, sorted(reads.items())
    # and the files are those of a full recompute
    derived = tmp_path / "data" / "derived"
    incremental = {p: p.read_bytes() for p in sorted(derived.rglob("*.parquet"))}
    job.run_once(full=True)
    assert {p: p.read_bytes() for p in sorted(derived.rglob("*.parquet"))} == incremental


def test_requests_running_into_the_hour_read_no_partition_two_hours_back(
        tmp_path: Path, traced: tuple[Counter[str], Counter[str]]) -> None:
    """An hour whose active requests include one that arrived in the hour before starts its
    energy extent there, and looks back one more hour from that start: the partition two
    hours back must still be the handed-over frame (it was read from its file again)."""
    reads, published = traced
    dd = DataDir(tmp_path / "data")
    # four hours of requests (from 50 min into the first), about 7 a second
    write_batches(dd, make_fleet(seconds=3 * 3600, rps=3.5, sample_hz=0.5))
    job = Pipeline(dd, PipelineConfig())
    job.run_once(full=True)
    assert len(published) == 4, sorted(published)
    requests = pl.read_parquet(sorted(published))
    hour_ns = 3600 * 10**9
    crossing = requests.filter(
        (pl.col(c.END_NS) // hour_ns) > (pl.col(c.ARRIVAL_NS) // hour_ns)).select(
        (pl.col(c.END_NS) // hour_ns).unique())
    assert crossing.height >= 2  # requests run into at least two of the later hours
    assert not reads, (sorted(published), sorted(reads.items()))
