"""Phase 2 of one hour in its shards, each task a process of its own (``bench/scale.py
--phase2``; issue 36): the shard tasks reading the ``requests`` partitions themselves (each
decodes the whole hour's) against the split tasks (``pipeline/phase2split.py``: the partitions
read once, a run of row groups a task) and the shard tasks from their pieces, then the reduce;
CPU-s and peaks per fleet size. Split from ``bench/scale.py``, which loads it and passes it
``bench/pipeline.py`` and ``bench/scale_memory.py`` as modules (``bench`` is no package).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fleetlens.pipeline.storage import DataDir  # noqa: E402

_PHASE2 = """
import json, pickle, resource, sys, time
from pathlib import Path
sys.path.insert(0, {repo!r})
import polars as pl
from fleetlens.pipeline import phase2split as ps
from fleetlens.pipeline.config import PipelineConfig
from fleetlens.pipeline.phase2 import phase2_shard
from fleetlens.pipeline.shards import Shard
from fleetlens.pipeline.storage import DataDir
args = json.loads({args!r})
cfg, dd, hour, out = PipelineConfig(), DataDir(args["data"]), args["hour"], Path(args["out"])
shards = [Shard(s[0], s[1], tuple(s[2]), s[3]) for s in args["shards"]]
chunk = args.get("chunk") and ps.RequestChunk(args["chunk"][0], tuple(args["chunk"][1]))
if args["mode"] == "noop":  # the imports alone: what every task process costs first
    pass
elif args["mode"] == "bounds":  # one chunk of the hour's own requests: its first and last
    json.dump(ps.chunk_bounds(dd, cfg, hour, chunk), open(out / f"bounds-{{args['n']}}.json", "w"))
elif args["mode"] == "split":  # one chunk's task: a piece per shard, kept as Arrow IPC
    extent = ps.extent_of(cfg, hour, [tuple(json.load(open(p)))
                                      for p in out.glob("bounds-*.json")])
    for i, piece in enumerate(ps.split_chunk(dd, chunk, extent, shards)):
        if piece is not None:
            piece.write_ipc(out / f"piece-{{i}}-{{args['n']}}.arrow", compression="uncompressed")
else:  # one shard's task from its pieces, its result kept for the reduce
    index, hours, pieces = shards[0].index, [], []
    for n, h in enumerate(args["hours"]):
        path = out / f"piece-{{index}}-{{n}}.arrow"
        if path.exists():
            hours.append(h)
            pieces.append(pl.read_ipc(path))
    cache = ps.as_cache(dd, ps.shard_pieces(hours, pieces))
    del pieces
    part = phase2_shard(dd, cfg, hour, {{hour}}, shards[0], cache)
    del cache
    with open(out / f"phase2-{{index}}.pickle", "wb") as handle:
        pickle.dump(part, handle)
use = resource.getrusage(resource.RUSAGE_SELF)
hwm = next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM"))
print(json.dumps({{"rss_mb": hwm / 1024, "cpu_s": use.ru_utime + use.ru_stime}}))
"""


def _phase2_task(mode: str, data: Path, out: Path, hour: int, shards: list, **extra) -> dict:
    """One task of the split phase 2 (``_PHASE2``) in a process of its own: its peak, CPU."""
    args = json.dumps({"mode": mode, "data": str(data), "out": str(out), "hour": hour,
                       "shards": [[s.index, s.count, list(s.hosts), s.rest] for s in shards],
                       **extra})
    done = subprocess.run([sys.executable, "-c", _PHASE2.format(repo=str(REPO), args=args)],
                          capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def _net(row: dict) -> str:
    """The shard tasks' CPU without their processes' start, before and after the split."""
    start = row["process_cpu_s"]
    before = row["old_cpu_s"] - row["shards"] * start
    after = (row["split_cpu_s"] + row["shard_cpu_s"]
             - (row["split_tasks"] + row["shards"]) * start)
    return f"without them {before:.1f} CPU-s before, {after:.1f} after ({after / before:.2f}x)"


def generate(bench: ModuleType, root: Path, gpus: int, first: int, hours: int) -> None:
    """``hours`` hours of a ``gpus``-GPU fleet from ``first``, as ``bench/scale_memory.py``
    generates one (the bench day's rates, one-minute segments), one random stream for all
    (so no trace id repeats across hours)."""
    from fleetlens.pipeline.schema import tables as t
    from fleetlens.pipeline.storage import write_parquet_atomic

    bench.GPUS, bench.HOSTS = gpus, gpus // bench.GPUS_PER_HOST
    bench.RPS = 10_000_000 / 86_400 * gpus / 64
    dd, rng, energy0, seq = DataDir(root), np.random.default_rng(1), np.full(gpus, 1e7), 0
    step = bench.HOUR_NS // 60
    for lo in range(first, first + hours * bench.HOUR_NS, step):
        for frame, table in ((bench.make_spans(rng, lo, lo + step), t.SPANS),
                             (bench.make_points(rng, lo, lo + step, energy0), t.METRIC_POINTS)):
            seq += 1
            write_parquet_atomic(frame, dd.raw_segment_path(
                t.table(table).raw_signal, lo - lo % bench.HOUR_NS, "gen", seq))


def phase2(args: argparse.Namespace, bench_pipeline: ModuleType,
           scale_memory: ModuleType) -> dict:
    """Phase 2 of the last of ``--phase2-hours`` hours of each fleet size in shards, each task
    a process of its own: the shard tasks reading the request partitions themselves (as
    before phase2split; each also reads the hour before's whole partition for requests
    running into its hour) against the split tasks and the shard tasks from their pieces,
    then the reduce (issue 36)."""
    from dataclasses import replace

    from fleetlens.pipeline.config import PipelineConfig
    from fleetlens.pipeline.discovery import discover
    from fleetlens.pipeline.phase2split import chunks, hours_bounded
    from fleetlens.pipeline.phases import phase1_files
    from fleetlens.pipeline.shards import plan_hour
    from fleetlens.pipeline.state import PipelineState

    cfg = replace(PipelineConfig(), shard_rows=args.shard_rows or PipelineConfig().shard_rows)
    out = []
    for gpus in args.gpus:
        with tempfile.TemporaryDirectory(prefix="fleetlens-p2-") as tmp:
            root, work = Path(tmp) / "data", Path(tmp) / "work"
            work.mkdir()
            first = (1_790_000_000 * bench_pipeline.NS) // bench_pipeline.HOUR_NS \
                * bench_pipeline.HOUR_NS
            generate(bench_pipeline, root, gpus, first, args.phase2_hours)
            dd, state = DataDir(root), PipelineState()
            discover(dd, state, int(cfg.max_sample_gap_s * bench_pipeline.NS),
                     cfg.lateness_s * bench_pipeline.NS)
            rows = {str(root / rel): seg.rows for rel, seg in state.segments.items()}
            for n in range(args.phase2_hours):  # phase 1 of every hour, published
                hour = first + n * bench_pipeline.HOUR_NS
                files, shards = phase1_files(state, dd, cfg, hour), plan_hour(state, cfg, hour)
                scale_memory._task("hour", files, hour, shards, "", str(root), rows=rows)
            old = [scale_memory._task("phase2shard", files, hour, [s],
                                      str(work / f"old-{s.index}.pickle"), str(root))
                   for s in shards]
            noop = _phase2_task("noop", root, work, hour, shards)
            plan = chunks(dd, cfg, hour)
            split = [_phase2_task(mode, root, work, hour, shards, n=n,
                                  chunk=[chunk.hour, list(chunk.groups or ())])
                     for mode in ("bounds", "split") for n, chunk in enumerate(plan)
                     if mode == "split" or chunk.hour in hours_bounded(cfg, hour)]
            new = [_phase2_task("shard", root, work, hour, [s], hours=[c.hour for c in plan])
                   for s in shards]
            merge = scale_memory._task("phase2merge", [str(work / f"phase2-{s.index}.pickle")
                                                       for s in shards], hour, shards, "",
                                       str(root))
        row = {"gpus": gpus, "shards": len(shards), "chunks": len(plan),
               "process_cpu_s": noop["cpu_s"], "process_mb": noop["rss_mb"],
               "split_tasks": len(split),
               "old_cpu_s": sum(r["cpu_s"] for r in old),
               "old_mb": max(r["rss_mb"] for r in old),
               "split_cpu_s": sum(r["cpu_s"] for r in split),
               "split_mb": max(r["rss_mb"] for r in split),
               "shard_cpu_s": sum(r["cpu_s"] for r in new),
               "shard_mb": max(r["rss_mb"] for r in new),
               "reduce_mb": merge["rss_mb"], "reduce_cpu_s": merge["cpu_s"]}
        print(f"{gpus:5d} GPUs, {row['shards']} shards, {row['chunks']} request chunks: shard "
              f"tasks reading the partitions themselves {row['old_cpu_s']:.1f} CPU-s (peak "
              f"{row['old_mb']:.0f} MiB); {row['split_tasks']} bounds and split tasks "
              f"{row['split_cpu_s']:.1f} CPU-s (peak "
              f"{row['split_mb']:.0f} MiB) + shard tasks from their pieces "
              f"{row['shard_cpu_s']:.1f} CPU-s (peak {row['shard_mb']:.0f} MiB) = "
              f"{row['split_cpu_s'] + row['shard_cpu_s']:.1f}; reduce {row['reduce_mb']:.0f} MiB "
              f"({row['reduce_cpu_s']:.1f} CPU-s); each task process starts with "
              f"{row['process_cpu_s']:.2f} CPU-s of imports (a Ray worker pays them once): "
              f"{_net(row)}; load {os.getloadavg()[0]:.1f}", flush=True)
        out.append(row)
    return {"phase2": out}
