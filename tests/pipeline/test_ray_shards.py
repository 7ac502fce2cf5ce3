"""``--runner ray`` with phase 1 in several shards per hour (each shard's halves and the merge
as tasks of their own, on a real two-node cluster on 127.0.0.1) writes the local runner's
one-shard bytes."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest

from fleetlens.pipeline.config import PipelineConfig
from fleetlens.pipeline.runner import OUTPUTS, Pipeline
from fleetlens.pipeline.storage import DataDir, parquet_files
from tests.pipeline.fleet import make_fleet, write_batches
from tests.pipeline.raycluster import connected_cluster
from tests.pipeline.test_shards import _with_gateways


def _digest(dd: DataDir) -> dict[str, str]:
    return {str(p.relative_to(dd.root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for table in OUTPUTS for p in parquet_files(dd.derived(table))}


@pytest.fixture(scope="module")
def cluster():
    with connected_cluster() as nodes:
        yield nodes


@pytest.mark.slow
def test_sharded_hours_on_ray_write_the_one_shard_bytes(tmp_path, cluster) -> None:
    from fleetlens.pipeline.ray_runner import RayPipeline

    fleet = _with_gateways(make_fleet(seed=3, hosts=9, seconds=600, rps=0.5, sample_hz=1.0))
    local, remote = DataDir(tmp_path / "local"), DataDir(tmp_path / "ray")
    write_batches(local, fleet)
    write_batches(remote, fleet)
    Pipeline(local, PipelineConfig()).run_once(full=True)
    job = RayPipeline(remote, replace(PipelineConfig(), hosts_per_shard=3),
                      address=cluster.address)
    summary = job.run_once(full=True)
    assert _digest(remote) == _digest(local) and len(_digest(local)) > 10
    # 11 hosts in shards of 3: 4 shards, each a point task and a span task, then the merge
    phase1 = [took for took in job.task_times if took.phase == 1]
    assert len(phase1) == summary.dirty_hours * (2 * 4 + 1)
