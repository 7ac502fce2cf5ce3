"""Phase 2's request partitions cut once into the shards' pieces (pipeline/phase2split.py):
each shard's pieces are exactly the rows of each partition its own read keeps (its hosts',
active in the fleet's energy extent, in file order), whether cut from whole partitions (the
local runner) or a run of row groups at a time (the Ray runner's split tasks), and a shard
given them computes what it computes reading the partitions itself."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest
from polars.testing import assert_frame_equal

from fleetlens.pipeline.config import PipelineConfig
from fleetlens.pipeline.partitions import HOUR_NS, existing_hours, partition_file
from fleetlens.pipeline.phase2 import merge_phase2, phase2_shard
from fleetlens.pipeline.phase2split import (
    FrameSplit,
    _active,
    _runs,
    as_cache,
    chunk_bounds,
    chunks,
    extent_of,
    fleet_extent,
    hours_bounded,
    hours_read,
    shard_pieces,
    split_chunk,
)
from fleetlens.pipeline.runner import Pipeline
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.shards import Shard, plan
from fleetlens.pipeline.state import PipelineState
from fleetlens.pipeline.storage import DataDir
from tests.pipeline.fleet import make_fleet, write_batches

CFG = PipelineConfig()


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> DataDir:
    """Three hours of five hosts' requests, the partitions rewritten in row groups of 64 rows
    (same rows, same order) so an hour's chunks are several and statistics can skip some."""
    dd = DataDir(tmp_path_factory.mktemp("split") / "data")
    write_batches(dd, make_fleet(seed=3, hosts=5, seconds=4000, rps=1.0, sample_hz=0.5))
    Pipeline(dd, CFG).run_once(full=True)
    for hour in existing_hours(dd, t.REQUESTS):
        path = partition_file(dd, t.REQUESTS, hour)
        pl.read_parquet(path).write_parquet(path, row_group_size=64)
    return dd


def _shards(dd: DataDir, per_shard: int) -> list[Shard]:
    return plan(list(PipelineState.load(dd).watermarks), per_shard)


def _filtered_read(dd: DataDir, hours: range, extent: tuple[int, int], shard: Shard
                   ) -> dict[int, pl.DataFrame]:
    """What a shard reading the partitions itself keeps of each, before its own filters."""
    out = {}
    for h in hours:
        path = partition_file(dd, t.REQUESTS, h)
        if path.exists():
            out[h] = pl.read_parquet(path).filter(shard.point_filter() & _active(*extent))
    return out


def _same(got: dict[int, pl.DataFrame], want: dict[int, pl.DataFrame]) -> None:
    assert sorted(got) == sorted(want)
    for h in want:
        assert_frame_equal(got[h], want[h])


@pytest.mark.parametrize("per_shard", [1, 2, 4])
def test_pieces_are_the_shards_filtered_reads(published: DataDir, per_shard: int) -> None:
    dd = published
    shards = _shards(dd, per_shard)
    assert len(shards) > 1
    checked = 0
    for hour in existing_hours(dd, t.REQUESTS):
        extent = fleet_extent(dd, CFG, hour)
        hours = hours_read(CFG, hour, extent)
        whole = {h: pl.read_parquet(p) for h in hours
                 if (p := partition_file(dd, t.REQUESTS, h)).exists()}
        by_frames = FrameSplit(whole, extent, shards)
        plan_ = chunks(dd, CFG, hour, rows=200)
        assert len(plan_) > len({chunk.hour for chunk in plan_})  # several chunks a partition
        # the Ray runner's extent, from every chunk's bounds, is the same
        assert extent_of(CFG, hour, [chunk_bounds(dd, CFG, hour, chunk) for chunk in plan_
                                     if chunk.hour in hours_bounded(CFG, hour)]) == extent
        split = [split_chunk(dd, chunk, extent, shards) for chunk in plan_]
        for shard in shards:
            want = _filtered_read(dd, hours, extent, shard)
            checked += sum(f.height for f in want.values())
            _same(by_frames.pieces(shard.index), want)
            got = shard_pieces([chunk.hour for chunk in plan_],
                               [pieces[shard.index] for pieces in split])
            _same({h: f for h, f in got.items() if h in hours}, want)
    assert checked > 1000


def test_a_shard_given_its_pieces_computes_what_it_reads(published: DataDir) -> None:
    """phase2_shard with its pieces (cut a run of row groups at a time, as the Ray runner's
    split tasks cut them) as its cache gives what reading the partitions itself gives."""
    dd = published
    shards = _shards(dd, 2)
    hour = existing_hours(dd, t.REQUESTS)[1]  # requests run into it from the hour before
    extent = fleet_extent(dd, CFG, hour)
    plan_ = chunks(dd, CFG, hour, rows=200)
    split = [split_chunk(dd, chunk, extent, shards) for chunk in plan_]
    given, read = [], []
    for shard in shards:
        pieces = shard_pieces([c.hour for c in plan_], [p[shard.index] for p in split])
        given.append(phase2_shard(dd, CFG, hour, set(), shard, as_cache(dd, pieces)))
        read.append(phase2_shard(dd, CFG, hour, set(), shard))
        assert read[-1].own.request_energy.height > 100
    # (a shard's rows come in no set order: the reduce sorts them)
    ours = merge_phase2(given, CFG.window_s, CFG.reduce_rows)
    theirs = merge_phase2(read, CFG.window_s, CFG.reduce_rows)
    assert ours.windows.height > 100
    for name in ("request_energy", "gpu_window_energy", "windows"):
        assert_frame_equal(getattr(ours, name), getattr(theirs, name))
    assert [h for h, _ in ours.crossers] == [h for h, _ in theirs.crossers]


def test_row_groups_outside_the_extent_are_not_read(published: DataDir) -> None:
    """Of the hour before, only the row groups of requests still running into the extent
    are read (its arrivals are all before the extent's start, most of its ends too)."""
    dd = published
    hours = existing_hours(dd, t.REQUESTS)
    extent = fleet_extent(dd, CFG, hours[1])
    before = pq.read_metadata(partition_file(dd, t.REQUESTS, hours[0]))
    runs = _runs(before, (0, before.num_row_groups), extent)
    assert before.num_row_groups > 3
    assert sum(rows for _, rows in runs) < before.num_rows / 2
    # the next hour's arrivals after the extent's end: those row groups are not read either
    assert extent[1] < hours[1] + 2 * HOUR_NS


def test_a_missing_partition_has_no_piece(tmp_path: Path, published: DataDir) -> None:
    hour = existing_hours(published, t.REQUESTS)[0]
    assert not chunks(DataDir(tmp_path), CFG, hour)
    assert FrameSplit({}, (hour, hour + HOUR_NS), _shards(published, 2)).pieces(1) == {}


def test_row_groups_are_skipped_only_without_an_active_request(tmp_path: Path) -> None:
    """By their statistics: a group of arrivals at or after the extent's end, or of arrivals
    and ends before its start (a null end: active by its arrival alone), is skipped; any
    group that may hold an active request is read, whole groups in file order."""
    from fleetlens.pipeline.schema import columns as c

    lo, hi = 1000, 2000
    arrivals = [100, 200, 300, 400, 500, 1500, 2500, 2600]
    ends = [150, None, 350, 1200, 550, None, 2700, None]
    path = tmp_path / "part.parquet"
    pl.DataFrame({c.ARRIVAL_NS: arrivals, c.END_NS: ends},
                 schema={c.ARRIVAL_NS: pl.Int64, c.END_NS: pl.Int64}).write_parquet(
        path, row_group_size=2)
    meta = pq.read_metadata(path)
    assert meta.num_row_groups == 4
    # groups: [100-200 ends 150/null: skip], [300-400 end 1200: read], [500, 1500: read],
    # [2500-2600: at or after the end: skip]
    assert _runs(meta, (0, 4), (lo, hi)) == [(2, 4)]
    assert _runs(meta, (1, 3), (lo, hi)) == [(2, 4)]
    assert _runs(meta, (0, 4), (0, 3000)) == [(0, 8)]
