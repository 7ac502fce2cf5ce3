"""Pipeline scale-out: the bench day on Ray, 1 node x 1 CPU against 2 nodes x 1 CPU, and the
local runner on the same CPUs.

Generates ``--hours`` of the bench fleet (``bench/pipeline.py``: 16 hosts x 4 GPUs, 116
requests/s, 10 Hz GPU samples), then times full recomputes (the second of two in one driver
process: the first also starts Ray's workers), the setups taking turns:

- ``local``: the local runner (two hours of phase 1 at once on threads, Polars' own threads);
- ``ray-1``: a one-node Ray cluster with one CPU, ``POLARS_MAX_THREADS=1`` in its workers so
  a task uses the one CPU it was given;
- ``ray-2``: the same with a second node (one CPU, one Polars thread).

Clusters run on this machine on 127.0.0.1 (``tests/pipeline/raycluster.py``: started with
``ray start``, stopped by process group). It prints the median wall time of ``--repeat`` runs
per setup, the ratio ray-2 / ray-1 (target <= 0.6) and ray-2 / local, and checks that every
run's derived files are byte-identical to the local runner's. Per Ray run it also prints the
tasks' CPU seconds against their wall seconds and each node's busy seconds, with the load
average: on a shared machine a second node only helps while a second core is free.

    .venv/bin/python bench/scale.py --hours 2 --repeat 3

``--memory`` instead prints the peak memory of each phase-1 and phase-2 task of one hour
against the fleet's size (``bench/scale_memory.py``: 64, 256 and 1,024 GPUs by default, each task a
process of its own; issue 36):

    .venv/bin/python bench/scale.py --memory --gpus 64 256 1024

``--fleet-gpus N`` times one hour of an N-GPU fleet instead (generated as ``--memory``
generates it; one run per driver, no warm-up), local against one and two Ray nodes:

    .venv/bin/python bench/scale.py --fleet-gpus 1024 --repeat 1 --object-store-gb 3

``--phase2`` runs phase 2 of one such hour in its shards, each task a process of its own: the
shard tasks reading the ``requests`` partitions themselves (each decodes the whole hour's)
against the split tasks (``pipeline/phase2split.py``: the partitions read once, a run of row
groups a task) and the shard tasks from their pieces, then the reduce; CPU-s and peaks:

    .venv/bin/python bench/scale.py --phase2 --gpus 256 1024

``--stage-cost`` runs the local runner over one such hour with its merges staged and bounded
(as it runs) against in memory (as before), taking turns: CPU, wall, peak and same bytes:

    .venv/bin/python bench/scale.py --stage-cost --gpus 256 --repeat 3

``--late-host`` times the incremental run after one host's last ten minutes of points arrive
late (``bench/scale_late.py``): only that host's points recomputed (as it runs) against every
host's (as before), taking turns: CPU, wall, peak and same bytes:

    .venv/bin/python bench/scale.py --late-host --gpus 256 --repeat 3
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fleetlens.pipeline.runner import OUTPUTS  # noqa: E402
from fleetlens.pipeline.storage import DataDir, parquet_files  # noqa: E402
from tests.pipeline.raycluster import RayCluster, ray_env  # noqa: E402

_spec = importlib.util.spec_from_file_location("bench_pipeline", REPO / "bench" / "pipeline.py")
bench_pipeline = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_pipeline)

#: Object store per node: an hour's phase-1 output is about 100 MB at the bench's rates.
OBJECT_STORE_BYTES = 1 << 30

_DRIVER = """
import json, resource, sys, time
sys.path.insert(0, {repo!r})
from fleetlens.pipeline.config import PipelineConfig
from fleetlens.pipeline.storage import DataDir
address = {address!r}
if address is None:
    from fleetlens.pipeline.runner import Pipeline as Job
    job = Job(DataDir({data!r}), PipelineConfig())
else:
    from fleetlens.pipeline.ray_runner import RayPipeline, connect
    connect(address)  # joining the cluster is not the pipeline's time
    job = RayPipeline(DataDir({data!r}), PipelineConfig(), address=address)
def cpu():
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime
began = time.perf_counter()
if {warmup!r}:
    job.run_once(full=True)  # cold: Ray starts this driver's worker processes
cold = time.perf_counter() - began
began, cpu0 = time.perf_counter(), cpu()  # warm, as each run of `pipeline --follow` is
summary = job.run_once(full=True)
wall, driver = time.perf_counter() - began, cpu() - cpu0
tasks = getattr(job, "task_times", [])
nodes = {{}}
for task in tasks:
    nodes[task.node] = nodes.get(task.node, 0.0) + task.end - task.start
print(json.dumps({{"wall_s": wall, "cold_s": cold, "hours": summary.dirty_hours,
                  "driver_cpu_s": driver, "tasks": len(tasks),
                  "task_cpu_s": sum(t.cpu_s for t in tasks),
                  "task_wall_s": sum(t.end - t.start for t in tasks),
                  "busy_s": sorted(nodes.values(), reverse=True),
                  "split_tasks": sum(getattr(t, "kind", "") == "split" for t in tasks),
                  "split_cpu_s": sum(t.cpu_s for t in tasks
                                     if getattr(t, "kind", "") == "split")}}))
"""


def digest(root: Path) -> str:
    """One hash over every derived file (path and bytes)."""
    dd, total = DataDir(root), hashlib.sha256()
    for table in OUTPUTS:
        for path in parquet_files(dd.derived(table)):
            total.update(str(path.relative_to(root)).encode())
            total.update(hashlib.sha256(path.read_bytes()).digest())
    return total.hexdigest()


def run_once(data: Path, address: str | None, warmup: bool = True) -> dict:
    """One full recompute by a driver process of its own (after a first one, ``warmup``);
    its wall time and outputs."""
    code = _DRIVER.format(repo=str(REPO), data=str(data), address=address, warmup=warmup)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=ray_env(), check=False)
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["digest"] = digest(data)
    return result


def start_cluster(nodes: int, store_bytes: int = OBJECT_STORE_BYTES) -> RayCluster:
    """A cluster of ``nodes`` one-CPU nodes, one Polars thread per worker, all joined."""
    cluster = RayCluster(env={"POLARS_MAX_THREADS": "1"},
                         node_args=("--object-store-memory", str(store_bytes)))
    try:
        cluster.start_head()
        for _ in range(nodes - 1):
            cluster.add_node()
        _wait_nodes(cluster, nodes)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _alive(address: str) -> int:
    code = (f"import ray; ray.init(address={address!r}, log_to_driver=False)\n"
            "print(sum(n['Alive'] for n in ray.nodes()))\n")
    out = subprocess.run([sys.executable, "-c", code], env=ray_env(), timeout=120,
                         capture_output=True, text=True)
    return int(out.stdout.split()[-1]) if out.returncode == 0 and out.stdout.split() else 0


def _wait_nodes(cluster: RayCluster, count: int) -> None:
    """Wait for ``count`` live nodes; a node whose ``ray start`` exited (e.g. a port taken
    between picking and binding it) is started again, twice at most."""
    restarts = 0
    deadline = time.monotonic() + 300  # a loaded 2-core machine has taken minutes
    while time.monotonic() < deadline:
        if _alive(cluster.address) >= count:
            return
        for i, node in enumerate(cluster.nodes[1:], start=1):
            if node.poll() is not None and restarts < 2:
                print(f"  node {i} exited: {cluster.log(f'node{i}')[-500:]}", flush=True)
                cluster.nodes[i] = cluster.add_node()
                cluster.nodes.pop()
                restarts += 1
        time.sleep(2)
    raise TimeoutError(f"fewer than {count} Ray nodes: {cluster.log('node1')[-1500:]}")


def _tasks(run: dict) -> str:
    """The Ray tasks of a run: their CPU against their wall time (well below it: the tasks
    did not get a core each) and each node's busy seconds."""
    if not run["tasks"]:
        return ""
    busy = ", ".join(f"{b:.1f}" for b in run["busy_s"])
    return (f", {run['tasks']} tasks: {run['task_cpu_s']:.1f} CPU-s in {run['task_wall_s']:.1f}"
            f" s of task wall, busy per node {busy} s (of them {run['split_tasks']} split "
            f"tasks: {run['split_cpu_s']:.1f} CPU-s)")


def interleaved(data: Path, repeat: int, warmup: bool = True,
                store_bytes: int = OBJECT_STORE_BYTES) -> dict[str, list[dict]]:
    """``repeat`` rounds of local, ray-1, ray-2 one after the other (both clusters up all
    along), so a change in the machine's load hits every setup alike. Each run is a driver
    process of its own that recomputes twice: Ray starts a driver's worker processes on its
    first tasks, so the second (timed) run is what a long-lived `pipeline --follow` sees."""
    clusters: dict[str, RayCluster] = {}
    runs: dict[str, list[dict]] = {"local": [], "ray-1": [], "ray-2": []}
    try:
        for nodes in (1, 2):  # one at a time: a failure stops those already started
            clusters[f"ray-{nodes}"] = start_cluster(nodes, store_bytes)
        for _ in range(repeat):
            for label in runs:
                address = clusters[label].address if label in clusters else None
                runs[label].append(run_once(data, address, warmup))
                last = runs[label][-1]
                print(f"  {label}: {last['wall_s']:.2f} s wall (first run of its driver "
                      f"{last['cold_s']:.2f} s), driver {last['driver_cpu_s']:.1f} CPU-s, "
                      f"{last['hours']} hours{_tasks(last)}; load {os.getloadavg()[0]:.1f}",
                      flush=True)
    finally:
        for cluster in clusters.values():
            cluster.stop()
    return runs


def memory(args: argparse.Namespace) -> None:
    """Peak memory per phase-1 and phase-2 task for one hour of each fleet size
    (bench/scale_memory.py)."""
    from fleetlens.pipeline.config import PipelineConfig

    scale_memory = _scale_memory()
    shard_rows = args.shard_rows or PipelineConfig().shard_rows
    print(f"machine: {bench_pipeline.machine()}; shard_rows {shard_rows:,}", flush=True)
    rows = []
    for gpus in args.gpus:
        began = time.perf_counter()
        rows.append(scale_memory.measure(bench_pipeline, gpus, shard_rows, args.unsharded_max))
        scale_memory.report(rows[-1:])
        print(f"  ({time.perf_counter() - began:.0f} s with the generation)", flush=True)
    scale_memory.report(rows)
    print(json.dumps(rows))


def _bench_module(name: str) -> object:
    """``bench/<name>.py`` as a module (``bench`` is no package)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _scale_memory() -> object:
    return _bench_module("scale_memory")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=2.0,
                        help="hours of the bench fleet to generate (the bench day is 24)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per setup")
    parser.add_argument("--memory", action="store_true",
                        help="peak memory per phase-1 and phase-2 task against fleet size instead")
    parser.add_argument("--fleet-gpus", type=int, default=0,
                        help="time one hour of a fleet of this many GPUs (generated as "
                        "--memory generates it) instead of --hours of the bench fleet; one "
                        "run per driver (no warm-up run: minutes of work, not Ray's start)")
    parser.add_argument("--object-store-gb", type=float, default=OBJECT_STORE_BYTES / (1 << 30),
                        help="object store per Ray node [default: 1]")
    parser.add_argument("--phase2", action="store_true",
                        help="phase 2 of one hour in shards per fleet size: the shard tasks' "
                        "CPU reading the request partitions themselves against the split")
    parser.add_argument("--stage-cost", action="store_true",
                        help="the local runner over one hour per fleet size with its merges "
                        "staged (bounded) against in memory (bench/scale_stage.py)")
    parser.add_argument("--late-host", action="store_true",
                        help="the incremental run after one host's late points: only its "
                        "points recomputed against every host's (bench/scale_late.py)")
    parser.add_argument("--phase2-hours", type=int, default=2,
                        help="--phase2: hours generated; phase 2 of the last is measured")
    parser.add_argument("--gpus", type=int, nargs="+", default=[64, 256, 1024],
                        help="fleet sizes for --memory (4 GPUs per host)")
    parser.add_argument("--shard-rows", type=int, default=None,
                        help="--memory: raw rows per shard [default: the pipeline's]")
    parser.add_argument("--unsharded-max", type=int, default=256,
                        help="--memory: also run the hour's phases unsharded up to this many GPUs")
    args = parser.parse_args()
    if args.memory:
        memory(args)
        return
    if args.stage_cost:
        print(f"machine: {bench_pipeline.machine()}", flush=True)
        print(json.dumps(_bench_module("scale_stage").stage_cost(args, bench_pipeline,
                                                                 _scale_memory())))
        return
    if args.late_host:
        print(f"machine: {bench_pipeline.machine()}", flush=True)
        print(json.dumps(_bench_module("scale_late").late_cost(
            args, bench_pipeline, _scale_memory(), _bench_module("scale_stage"))))
        return
    if args.phase2:
        print(f"machine: {bench_pipeline.machine()}", flush=True)
        print(json.dumps(_bench_module("scale_phase2").phase2(args, bench_pipeline,
                                                              _scale_memory())))
        return
    root = Path(tempfile.mkdtemp(prefix="fleetlens-scale-"))
    try:
        began = time.perf_counter()
        if args.fleet_gpus:  # one hour of a bigger fleet, generated as --memory generates it
            hour = (1_790_000_000 * bench_pipeline.NS) // bench_pipeline.HOUR_NS \
                * bench_pipeline.HOUR_NS
            spans, points = _scale_memory().generate(bench_pipeline, root, args.fleet_gpus,
                                                     hour)
            what = f"1 h of {args.fleet_gpus} GPUs"
        else:
            start = (time.time_ns() // bench_pipeline.HOUR_NS - 48) * bench_pipeline.HOUR_NS
            spans, points = bench_pipeline.write_hours(
                DataDir(root), start, args.hours, 1, np.full(bench_pipeline.GPUS, 1e7), "gen")
            what = f"{args.hours:g} h of the bench fleet"
        print(f"{what}: {spans:,} spans, {points:,} metric points, generated in "
              f"{time.perf_counter() - began:.1f} s; {bench_pipeline.machine()}", flush=True)
        runs = interleaved(root, args.repeat, warmup=not args.fleet_gpus,
                           store_bytes=int(args.object_store_gb * (1 << 30)))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = {k: statistics.median(r["wall_s"] for r in v) for k, v in runs.items()}
    same = len({r["digest"] for v in runs.values() for r in v}) == 1
    for label, value in med.items():
        cold = statistics.median(r["cold_s"] for r in runs[label])
        cpu = statistics.median(r["task_cpu_s"] + r["driver_cpu_s"] for r in runs[label])
        print(f"{label}: median {value:.2f} s wall of {args.repeat} (first run of a driver: "
              f"{cold:.2f} s), {cpu:.1f} CPU-s (driver + tasks; local: all)")
    print(f"ray-2 / ray-1: {med['ray-2'] / med['ray-1']:.2f} (target <= 0.6); "
          f"ray-2 / local: {med['ray-2'] / med['local']:.2f}; ray-1 / local: "
          f"{med['ray-1'] / med['local']:.2f}; outputs identical in every run: {same}")
    print(json.dumps({"hours": 1 if args.fleet_gpus else args.hours,
                      "gpus": args.fleet_gpus or bench_pipeline.GPUS,
                      "spans": spans, "points": points,
                      **{f"{k}_s": round(v, 2) for k, v in med.items()},
                      "ratio_2_1": round(med["ray-2"] / med["ray-1"], 3), "identical": same}))


if __name__ == "__main__":
    main()
