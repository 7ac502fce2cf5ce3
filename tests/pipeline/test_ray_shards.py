"""``--runner ray`` with both phases in several shards per hour (phase 1: each chunk's split,
each shard's halves and the merge as tasks of their own; phase 2: a task per shard and the
reduce, after split tasks cutting the request partitions into the shards' pieces; on a real
two-node cluster on 127.0.0.1) writes the local runner's one-shard bytes,
also when the node running a shard task is killed mid-run."""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import replace

import pytest

from fleetlens.pipeline.config import PipelineConfig
from fleetlens.pipeline.runner import OUTPUTS, Pipeline
from fleetlens.pipeline.storage import DataDir, parquet_files
from tests.pipeline.fleet import make_fleet, with_gateways, write_batches
from tests.pipeline.raycluster import connected_cluster, task_titles


def _digest(dd: DataDir) -> dict[str, str]:
    return {str(p.relative_to(dd.root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for table in OUTPUTS for p in parquet_files(dd.derived(table))}


@pytest.fixture(scope="module")
def cluster():
    with connected_cluster() as nodes:
        yield nodes


@pytest.mark.slow
@pytest.mark.parametrize("split_from", [2, 6])  # 4 shards: split by split tasks, or not
def test_sharded_hours_on_ray_write_the_one_shard_bytes(tmp_path, cluster, split_from) -> None:
    from fleetlens.pipeline.ray_runner import RayPipeline

    fleet = with_gateways(make_fleet(seed=3, hosts=9, seconds=600, rps=0.5, sample_hz=1.0), 9)
    local, remote = DataDir(tmp_path / "local"), DataDir(tmp_path / "ray")
    write_batches(local, fleet)
    write_batches(remote, fleet)
    Pipeline(local, PipelineConfig()).run_once(full=True)
    job = RayPipeline(remote, replace(PipelineConfig(), hosts_per_shard=3,
                                      split_from_shards=split_from), address=cluster.address)
    summary = job.run_once(full=True)
    assert _digest(remote) == _digest(local) and len(_digest(local)) > 10
    # 11 hosts in shards of 3: 4 shards, each a point task and a span task, then the merge;
    # in phase 2 a task per shard, then the reduce
    shard = [took for took in job.task_times if took.kind == "shard"]
    phase1 = [took for took in shard if took.phase == 1]
    assert len(phase1) == summary.dirty_hours * (2 * 4 + 1)
    phase2 = [took for took in shard if took.phase == 2]
    assert len(phase2) == summary.dirty_hours * (4 + 1)
    # the split tasks (from split_from shards) are timed too, in both phases
    split = {took.phase for took in job.task_times if took.kind == "split"}
    assert split == ({1, 2} if split_from <= 4 else set())


@pytest.mark.slow
@pytest.mark.parametrize(("late", "late_spans"), [({"h3", "h7"}, False), ({"h0"}, False),
                                                  ({"h5"}, True)])
def test_late_points_on_ray_recompute_only_the_dirty_hosts(tmp_path, cluster, late,
                                                           late_spans) -> None:
    """The dirty-host runs of tests/pipeline/test_dirty_hosts.py on the cluster (split tasks
    for the dirty hosts' shards, a task for the kept rows; the span halves as tasks when
    spans are late, else in the merge if h0's mapping changed): the full run's bytes, and
    only the dirty hosts' point tasks ran; phase 2 keeps the clean hosts' results (kept shard
    tasks) unless late spans rewrote the hour's requests."""
    from fleetlens.pipeline.ray_runner import RayPipeline
    from fleetlens.pipeline.schema import columns as c
    from fleetlens.pipeline.schema import tables as t
    from tests.pipeline.fleet import Fleet
    from tests.pipeline.rawdata import points_frame, spans_frame, write_raw

    fleet = with_gateways(make_fleet(seed=3, hosts=9, seconds=600, rps=0.5, sample_hz=1.0), 9)
    cfg = replace(PipelineConfig(), lateness_s=3600, hosts_per_shard=1, split_from_shards=2,
                  reduce_rows=300)
    full, remote = DataDir(tmp_path / "full"), DataDir(tmp_path / "ray")
    write_batches(full, fleet)
    Pipeline(full, cfg).run_once(full=True)
    last = len(fleet.point_batches) - 1
    held = [p for p in fleet.point_batches[last] if p[c.HOST_NAME] in late]
    spans = [s for s in fleet.span_batches[last] if late_spans and s[c.HOST_NAME] in late]
    write_batches(remote, Fleet(
        [*fleet.span_batches[:last], [s for s in fleet.span_batches[last] if s not in spans]],
        [*fleet.point_batches[:last], [p for p in fleet.point_batches[last] if p not in held]],
        fleet.distinct_requests))
    job = RayPipeline(remote, cfg, address=cluster.address)
    job.run_once()
    write_raw(remote, t.METRIC_POINTS, points_frame(held), writer="late", seq=9)
    if spans:
        write_raw(remote, t.SPANS, spans_frame(spans), writer="late", seq=9)
    summary = job.run_once()
    assert _digest(remote) == _digest(full)
    assert summary.kept_host_hours >= summary.dirty_hours and (
        (t.REQUESTS in summary.rows_written) == (late != {"h3", "h7"}))
    # phase 2 keeps the clean hosts (of 11) of each hour, unless late spans rewrote the
    # requests (h0's late labels rewrite only the requests of its own instance ids)
    assert summary.kept_host_hours_phase2 == (
        0 if late_spans else (11 - len(late)) * summary.dirty_hours)
    # per phase-1 hour: a point task per dirty host (shards of one), the kept rows' task and
    # the merge; 11 span tasks (11 shards) in each hour late spans overlap, none otherwise
    phase1 = [took for took in job.task_times if took.kind == "shard" and took.phase == 1]
    hours = len({took.hour for took in phase1})
    with_spans, rest = divmod(len(phase1) - hours * (len(late) + 2), 11)
    assert rest == 0 and (with_spans > 0) == late_spans, len(phase1)


@pytest.mark.slow
def test_a_shard_task_killed_mid_run_is_retried_and_the_files_are_the_same(
        tmp_path, cluster, capfd) -> None:
    """The worker node is killed (raylet, agents, workers: SIGKILL) while it runs a chunk's
    split task, a shard's point or span task or a phase-2 split or shard task: Ray reruns that task
    on the head, and any task whose result lived on the dead node (a split's pieces or a
    finished half the merge still needs), and the files are still the local runner's
    one-shard bytes. Last in this module: it leaves one node."""
    from fleetlens.pipeline.ray_runner import RayPipeline

    # Three hours of 9 hosts in shards of 3: 12 shard tasks an hour, half of them on the
    # worker node (the tasks are spread), each long enough to be caught running.
    fleet = with_gateways(make_fleet(seed=5, hosts=9, seconds=2 * 3600, rps=0.3,
                                     sample_hz=0.5, batches=2), 9)
    local, remote = DataDir(tmp_path / "local"), DataDir(tmp_path / "ray")
    write_batches(local, fleet)
    write_batches(remote, fleet)
    Pipeline(local, PipelineConfig()).run_once(full=True)
    worker = cluster.nodes[1]
    killed: list[str] = []
    done = threading.Event()

    def kill_while_it_runs_a_shard_task() -> None:
        while not done.is_set():
            running = [n for n in task_titles(worker)
                       if n.startswith(("ray::_split_task", "ray::_points_task",
                                        "ray::_spans_task", "ray::_phase2_split_task",
                                        "ray::_phase2_shard_task"))]
            if running:
                cluster.kill(worker)
                killed.extend(running)
                return
            time.sleep(0.002)

    watcher = threading.Thread(target=kill_while_it_runs_a_shard_task, daemon=True)
    watcher.start()
    try:
        job = RayPipeline(remote, replace(PipelineConfig(), hosts_per_shard=3,
                                          split_from_shards=2), address=cluster.address)
        summary = job.run_once(full=True)
    finally:
        done.set()
        watcher.join(timeout=30)
    assert killed, "the worker node ran none of the shard tasks"
    assert worker.poll() is not None
    assert "will be retried" in capfd.readouterr().out  # Ray's driver reran a task
    assert summary.dirty_hours >= 3
    assert _digest(remote) == _digest(local) and len(_digest(local)) > 10
