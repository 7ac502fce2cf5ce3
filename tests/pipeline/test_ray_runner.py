"""``--runner ray`` against the local runner, on a real two-node Ray cluster on 127.0.0.1
(two ``ray start`` process groups, one CPU each): byte-identical derived files, also when a
worker node is killed mid-run; and Ray stays optional for the local runner."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fleetlens.pipeline.config import PipelineConfig
from fleetlens.pipeline.runner import OUTPUTS, Pipeline
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, parquet_files
from tests.pipeline.fleet import make_fleet, write_batches
from tests.pipeline.raycluster import connected_cluster, ray_env, task_titles

REPO = Path(__file__).resolve().parents[2]
HOUR_S = 3600
ANALYTICS = (t.BASELINES, t.INCIDENTS, t.CAUSES)


def _digest(dd: DataDir) -> dict[str, str]:
    """Hashes of the pipeline's derived files and the analytics' tables."""
    files = [p for table in OUTPUTS for p in parquet_files(dd.derived(table))]
    files += [p for table in ANALYTICS for p in parquet_files(dd.table_dir(table))]
    return {str(p.relative_to(dd.root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in files}


def _fleetlens(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fleetlens", *args], capture_output=True,
                          text=True, env=env, cwd=REPO, timeout=300)


@pytest.fixture(scope="module")
def fleet():
    # Five hours (a request crossing each boundary), light enough for one CPU per node.
    return make_fleet(seed=7, hosts=2, seconds=4 * HOUR_S, rps=0.2, sample_hz=0.5, batches=4)


@pytest.fixture(scope="module")
def cluster():
    """A head and one worker node; this process is a driver connected to it."""
    with connected_cluster() as nodes:
        yield nodes


@pytest.mark.slow
def test_cli_ray_runner_publishes_the_local_runners_bytes(tmp_path, fleet, cluster) -> None:
    """`fleetlens pipeline --runner ray --ray-address --analyze` (a driver process of its own)
    writes the same files, byte for byte, as `fleetlens pipeline --analyze`: the pipeline's
    and the analytics' (attributed on the cluster too); a full run, then an incremental one."""
    local, remote = DataDir(tmp_path / "local"), DataDir(tmp_path / "ray")
    summaries = []
    for batches in (range(0, 2), range(2, 4)):  # the second run is incremental
        write_batches(local, fleet, batches)
        write_batches(remote, fleet, batches)
        here = _fleetlens("pipeline", "--data-dir", str(local.root), "--json", "--no-progress",
                          "--analyze")
        assert here.returncode == 0, here.stderr[-3000:]
        ran = _fleetlens("pipeline", "--data-dir", str(remote.root), "--runner", "ray",
                         "--ray-address", cluster.address, "--json", "--no-progress",
                         "--analyze", env=ray_env())
        assert ran.returncode == 0, ran.stderr[-3000:]
        summaries.append(json.loads(ran.stdout.splitlines()[0]))
        # the summary, then one JSON line per new incident
        assert len(ran.stdout.splitlines()) == len(here.stdout.splitlines())
        assert _digest(remote) == _digest(local)
    assert summaries[0]["dirty_hours"] >= 3 and summaries[1]["new_segments"] > 0
    assert len(_digest(local)) > 20
    assert any(t.BASELINES in name for name in _digest(local))


@pytest.mark.slow
def test_damaged_segment_on_ray_is_named_not_retried(tmp_path, cluster) -> None:
    """A raw segment cut short fails the task that reads it: the run stops with the local
    runner's message naming the file (a permanent error: Ray does not rerun the task)."""
    dd = DataDir(tmp_path / "data")
    write_batches(dd, make_fleet(seed=1, seconds=60))
    damaged = sorted((dd.root / "raw" / "spans").rglob("*.parquet"))[0]
    with open(damaged, "r+b") as handle:
        handle.truncate(500)
    ran = _fleetlens("pipeline", "--data-dir", str(dd.root), "--runner", "ray",
                     "--ray-address", cluster.address, "--no-progress", env=ray_env())
    assert ran.returncode == 1, ran.stderr[-3000:]
    assert str(damaged.relative_to(dd.root)) in ran.stderr
    assert "Traceback" not in ran.stderr and "will be retried" not in ran.stdout + ran.stderr


@pytest.mark.slow
def test_the_tasks_encode_the_parquet_the_driver_writes_bytes(tmp_path, fleet, cluster,
                                                              monkeypatch) -> None:
    """The driver encodes no partition of a full run (the tasks return Parquet bytes, the
    half of the driver's CPU the Ray runner used to spend), and the bytes it writes are the
    local runner's files."""
    import polars as pl

    from fleetlens.pipeline.ray_runner import RayPipeline

    local, remote = DataDir(tmp_path / "local"), DataDir(tmp_path / "ray")
    write_batches(local, fleet)
    write_batches(remote, fleet)
    Pipeline(local, PipelineConfig()).run_once()
    encoded: list[int] = []

    def refuse(frame: pl.DataFrame, *args: object, **kwargs: object) -> None:
        encoded.append(frame.height)
        raise AssertionError("the driver encoded a partition")

    monkeypatch.setattr(pl.DataFrame, "write_parquet", refuse)  # this process only
    job = RayPipeline(remote, PipelineConfig(), address=cluster.address)
    summary = job.run_once()
    monkeypatch.undo()
    assert not encoded
    assert summary.dirty_hours >= 4 and sum(summary.rows_written.values()) > 0
    assert _digest(remote) == _digest(local)
    # Every task reported where and how long it ran; the hours went to both nodes.
    phase2 = [took for took in job.task_times if took.phase == 2]
    assert len(phase2) == summary.dirty_hours and len(job.task_times) > len(phase2)
    assert all(took.end >= took.start and took.cpu_s > 0 for took in job.task_times)
    assert len({took.node for took in job.task_times}) == 2


@pytest.mark.slow
def test_worker_node_killed_mid_run_outputs_identical(tmp_path, fleet, cluster,
                                                     capfd) -> None:
    """The worker node is killed (raylet, agents, workers: SIGKILL) while it runs one of the
    pipeline's tasks: Ray reruns that task on the head, and the files are still the local
    runner's. Last in this module: it leaves one node."""
    from fleetlens.pipeline.ray_runner import RayPipeline

    local, remote = DataDir(tmp_path / "local"), DataDir(tmp_path / "ray")
    write_batches(local, fleet)
    write_batches(remote, fleet)
    Pipeline(local, PipelineConfig()).run_once()
    worker = cluster.nodes[1]
    killed: list[str] = []
    done = threading.Event()

    def kill_while_it_runs_a_task() -> None:
        while not done.is_set():
            running = [n for n in task_titles(worker) if n.startswith("ray::_phase")]
            if running:
                cluster.kill(worker)
                killed.extend(running)
                return
            time.sleep(0.002)

    watcher = threading.Thread(target=kill_while_it_runs_a_task, daemon=True)
    watcher.start()
    try:
        summary = RayPipeline(remote, PipelineConfig(), address=cluster.address).run_once()
    finally:
        done.set()
        watcher.join(timeout=30)
    assert killed, "the worker node ran none of the tasks"
    assert worker.poll() is not None
    # Ray's driver says so when it reruns a task of the dead node.
    assert "will be retried" in capfd.readouterr().out
    assert summary.dirty_hours >= 4
    assert _digest(remote) == _digest(local)


def test_local_runner_never_imports_ray(tmp_path) -> None:
    """`fleetlens pipeline` without --runner runs without importing Ray (an optional extra)."""
    dd = DataDir(tmp_path / "data")
    write_batches(dd, make_fleet(seconds=120, batches=1))
    code = ("import sys; from fleetlens.cli import cli\n"
            f"try: cli(['pipeline', '--data-dir', {str(dd.root)!r}, '--no-progress'])\n"
            "except SystemExit as e: assert not e.code, e.code\n"
            "assert 'ray' not in sys.modules, 'ray imported'\n")
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert "hours recomputed" in ran.stdout


def test_runner_ray_without_ray_is_a_clear_error(tmp_path) -> None:
    """Without Ray installed, --runner ray says how to install it (no traceback), and
    --ray-address without --runner ray is a usage error."""
    dd = DataDir(tmp_path / "data")
    dd.root.mkdir(parents=True)
    code = ("import sys; sys.modules['ray'] = None\n"  # import ray -> ImportError
            "from fleetlens.cli import cli\n"
            f"cli(['pipeline', '--data-dir', {str(dd.root)!r}, '--runner', 'ray'])\n")
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    assert ran.returncode == 1
    assert "pip install 'fleetlens[ray]'" in ran.stderr and "Traceback" not in ran.stderr
    wrong = _fleetlens("pipeline", "--data-dir", str(dd.root), "--ray-address", "127.0.0.1:1")
    assert wrong.returncode == 2 and "--ray-address needs --runner ray" in wrong.stderr
