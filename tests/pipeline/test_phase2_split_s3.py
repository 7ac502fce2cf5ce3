"""Phase 2's split of the request partitions on an s3:// data directory (a moto server): the
local runner's sharded hours write a local directory's bytes, and a split task's chunk there
(a whole partition: no footer read apart from its bytes) gives the pieces a local file's row
groups give."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

from polars.testing import assert_frame_equal

from fleetlens.pipeline.config import PipelineConfig
from fleetlens.pipeline.partitions import existing_hours
from fleetlens.pipeline.phase2split import chunks, fleet_extent, shard_pieces, split_chunk
from fleetlens.pipeline.runner import OUTPUTS, Pipeline
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.shards import plan
from fleetlens.pipeline.state import PipelineState
from fleetlens.pipeline.storage import DataDir, parquet_files
from tests.pipeline.fleet import make_fleet, write_batches
from tests.s3 import S3Server, moto_server, s3_server  # noqa: F401 - the fixture `s3`

CFG = replace(PipelineConfig(), hosts_per_shard=2)


def _digest(dd: DataDir) -> dict[str, str]:
    return {str(p.relative_to(dd.root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for table in OUTPUTS for p in parquet_files(dd.derived(table))}


def test_sharded_phase2_on_a_bucket_is_the_local_bytes(s3: S3Server, tmp_path: Path) -> None:
    fleet = make_fleet(seed=4, hosts=5, seconds=1500, rps=0.5, sample_hz=0.5)
    local = DataDir(tmp_path / "local")
    remote = DataDir(f"s3://{s3.bucket()}/split")
    one = DataDir(tmp_path / "one")
    for dd in (local, remote, one):
        write_batches(dd, fleet)
    Pipeline(one, PipelineConfig()).run_once(full=True)  # one shard
    for dd in (local, remote):
        Pipeline(dd, CFG).run_once(full=True)
    assert _digest(remote) == _digest(local) == _digest(one) and len(_digest(one)) > 10
    # the Ray runner's split tasks: a whole partition per chunk on the bucket
    shards = plan(list(PipelineState.load(local).watermarks), 2)
    hour = existing_hours(local, t.REQUESTS)[1]
    extent = fleet_extent(local, CFG, hour)
    assert fleet_extent(remote, CFG, hour) == extent
    plans = {dd: chunks(dd, CFG, hour) for dd in (local, remote)}
    assert all(chunk.groups is None for chunk in plans[remote])
    for shard in shards:
        got = [shard_pieces([c.hour for c in plans[dd]],
                            [split_chunk(dd, c, extent, shards)[shard.index]
                             for c in plans[dd]]) for dd in (local, remote)]
        assert sorted(got[0]) == sorted(got[1]) and got[0]
        for h in got[0]:
            assert_frame_equal(got[0][h], got[1][h])
