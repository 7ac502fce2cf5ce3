"""Peak memory per phase-1 and phase-2 task against fleet size (``bench/scale.py --memory``).

For each fleet size (GPUs, 4 per host, one vLLM instance per GPU) it generates one hour the
way ``bench/pipeline.py`` generates the bench day (116 requests/s per 64 GPUs, 10 Hz
``hw.power`` + ``hw.energy`` per GPU, engine metrics at 1 Hz, the mapping gauge every 10 s),
plans the hour's (host group x hour) shards (:func:`pipeline.shards.plan_hour`, the default
``shard_rows`` unless ``--shard-rows``) and runs every task in a fresh process of its own,
reading its peak RSS (``VmHWM``) when it ends:

- ``split``: (several shards only) the hour's raw segments read once, a chunk at a time, and
  split into the shards' pieces (:mod:`pipeline.shardsplit`), written as Arrow IPC files;
- ``points``: one shard's point half (its hosts' metric points, from its pieces -> GPU and
  engine tables); with several shards also run reading the raw segments itself, as before
  the split, for the CPU it cost (every shard decoded every segment);
- ``spans``: one shard's span half (its trace bucket's spans, from its pieces -> requests);
  both halves stage their tables in files for the merge, as the runners do;
- ``merge``: phase 1's merge task over every shard's staged halves (each partition merged a
  range at a time into a file; with one shard too, for a figure to compare);
- ``hour``: the whole hour as the local runner runs it (every shard one after the other, then
  the merge, staged as the runner stages it): what one thread of ``--runner local`` holds;
  with one shard it is also the Ray runner's one phase-1 task;
- ``unsharded``: the hour in one shard, as before issue 36 (skipped above ``--unsharded-max``
  GPUs: it needs about 1 GB per 64 GPUs);
- ``phase 2``: energy and windows of the hour in the same shards (:mod:`pipeline.phase2`):
  each shard's map task (its hosts' rows of the published phase-1 partitions -> its rows and
  the fleet-wide partials; its request_energy rows and latencies staged in files, the rest
  kept in a pickle), then the reduce task over all of them (request_energy merged a range at
  a time into a file beside its partition, the other partitions encoded), and the hour in
  one unsharded task as before (up to ``--unsharded-max`` GPUs).

A fresh Python with Polars, PyArrow and fleetlens imported holds about 150 MiB before any
data: it is in every figure.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import numpy as np
import polars as pl

REPO = Path(__file__).resolve().parents[1]

_TASK = """
import json, resource, sys, time
sys.path.insert(0, {repo!r})
import polars as pl
from fleetlens.pipeline import phases
from fleetlens.pipeline.config import PipelineConfig
from fleetlens.pipeline.shards import Shard
args = json.loads({args!r})
cfg, files, hour = PipelineConfig(), args["files"], args["hour"]
shards = [Shard(s[0], s[1], tuple(s[2]), s[3]) for s in args["shards"]]
segment_rows = args["rows"].__getitem__
def pieces(signal):  # the shard's pieces the split task wrote (None: read the raw segments)
    if not args["pieces"]:
        return None
    from pathlib import Path
    from fleetlens.pipeline.shardsplit import shard_rows
    found = sorted(Path(args["pieces"]).glob(f"{{signal}}-{{shards[0].index}}-*.arrow"),
                   key=lambda p: int(p.stem.rsplit("-", 1)[1]))
    return shard_rows([pl.read_ipc(p) for p in found])
began = time.perf_counter()
if args["mode"] == "split":
    from pathlib import Path
    from fleetlens.pipeline.shardsplit import chunks
    rows = 0
    for n, chunk in enumerate(chunks(files, segment_rows)):
        for i, piece in enumerate(phases.split_chunk(cfg, chunk, hour, shards)):
            piece.write_ipc(Path(args["pieces"]) / f"{{chunk.signal}}-{{i}}-{{n}}.arrow",
                            compression="uncompressed")
            rows += piece.height
elif args["mode"] == "points":  # its tables staged for the merge, as the runners stage them
    import pickle
    from pathlib import Path
    from fleetlens.pipeline.rangemerge import rows as piece_rows
    out = phases.phase1_points(cfg, files, hour, shards[0], pieces("metrics"),
                               Path(args["stage"]) if args["stage"] else None)
    out.mapping.write_parquet(args["mapping"])
    rows = sum(piece_rows(f) for _, f in out.tables)
    if args["keep"]:
        with open(args["keep"], "wb") as handle:
            pickle.dump(out, handle)
elif args["mode"] == "spans":
    import pickle
    from pathlib import Path
    from fleetlens.pipeline.rangemerge import rows as piece_rows
    mapping = pl.read_parquet(args["mapping"])
    out = phases.phase1_spans(cfg, files, hour, shards[0], mapping, pieces("spans"),
                              Path(args["stage"]) if args["stage"] else None)
    rows = piece_rows(out.requests)
    if args["keep"]:
        with open(args["keep"], "wb") as handle:
            pickle.dump(out, handle)
elif args["mode"] == "phase1merge":  # the merge task: every half in, the hour's files out
    import pickle
    from pathlib import Path
    from fleetlens.pipeline.rangemerge import rows as piece_rows
    from fleetlens.pipeline.shardreduce import merge_phase1
    halves = []
    for path in args["files"]:
        with open(path, "rb") as handle:
            halves.append(pickle.load(handle))
    points, spans = halves[:len(shards)], halves[len(shards):]
    out = Path(args["stage"]) / "out"
    merged = merge_phase1(points, spans, cfg.reduce_rows,
                          {{name: out / name / "part.parquet" for name in phases.PHASE1_TABLES}})
    rows = sum(piece_rows(piece) for _, piece in merged)
elif args["mode"] == "phase2":  # the hour in one shard, as before phase 2 was sharded
    from fleetlens.pipeline.storage import DataDir
    out = phases.phase2_hour(DataDir(args["data"]), cfg, hour, {{hour}})
    rows = out.windows.height + out.request_energy.height
elif args["mode"] == "phase2shard":  # one shard's map task; its result kept for the reduce
    import pickle
    from fleetlens.pipeline.phase2 import phase2_shard
    from fleetlens.pipeline.storage import DataDir
    from pathlib import Path
    from fleetlens.pipeline.rangemerge import rows as piece_rows
    # its two big results staged, as both runners stage them on a local data directory
    stage_to = Path(args["data"]) / "state" / "staging" / f"phase2-{{hour}}"
    part = phase2_shard(DataDir(args["data"]), cfg, hour, {{hour}}, shards[0], None, stage_to)
    rows = piece_rows(part.own.request_energy) + part.own.windows.height
    with open(args["mapping"], "wb") as handle:
        pickle.dump(part, handle)
elif args["mode"] == "phase2merge":  # the reduce: every shard's result in, the hour out
    import pickle
    import io
    from fleetlens.pipeline.phase2 import energy_file, merge_phase2
    from fleetlens.pipeline.partitions import PARQUET
    from fleetlens.pipeline.rangemerge import rows as piece_rows
    from fleetlens.pipeline.storage import DataDir
    parts = []
    for path in args["files"]:
        with open(path, "rb") as handle:
            parts.append(pickle.load(handle))
    # request_energy written beside its partition, as the runners' reduce writes it
    out = merge_phase2(parts, cfg.window_s, cfg.reduce_rows,
                       energy_file(DataDir(args["data"]), hour))
    rows = piece_rows(out.request_energy)
    out.request_energy.path.unlink()
    for frame in (out.gpu_window_energy, out.windows):
        # encoded as the Ray merge task encodes (ray_base.encode; Ray not imported here)
        frame.rechunk().write_parquet(io.BytesIO(), **PARQUET)
        rows += frame.height
else:
    from fleetlens.pipeline.partitions import partition_file, publish, publish_staged
    from fleetlens.pipeline.rangemerge import Staged, staging_folder
    from fleetlens.pipeline.rangemerge import rows as piece_rows
    from fleetlens.pipeline.storage import DataDir
    # as the local runner runs it: with several shards on a data directory, staged
    dd = DataDir(args["data"]) if args["data"] else None
    folder = staging_folder(dd, 1, hour) if dd and len(shards) > 1 else None
    write_to = folder and {{name: partition_file(dd, name, hour)
                            for name in phases.PHASE1_TABLES}}
    parts = phases.phase1_hour(cfg, files, hour, shards, segment_rows, folder, write_to)
    rows = sum(piece_rows(f) for _, f in parts)
    for table, frame in parts if dd else ():  # the hour's partitions, for the phase-2 task
        if isinstance(frame, Staged):
            publish_staged(dd, table, hour, frame)
        else:
            publish(dd, table, hour, frame)
use = resource.getrusage(resource.RUSAGE_SELF)
hwm = next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM"))
print(json.dumps({{"rss_mb": hwm / 1024, "cpu_s": use.ru_utime + use.ru_stime,
                  "wall_s": time.perf_counter() - began, "rows": rows}}))
"""


def generate(bench: ModuleType, root: Path, gpus: int, hour: int) -> tuple[int, int]:
    """One hour of a ``gpus``-GPU fleet at the bench day's rates, as raw segments of about
    one minute each (the generator holds one minute of points at a time)."""
    from fleetlens.pipeline.schema import tables as t
    from fleetlens.pipeline.storage import DataDir, write_parquet_atomic

    bench.GPUS, bench.HOSTS = gpus, gpus // bench.GPUS_PER_HOST
    bench.RPS = 10_000_000 / 86_400 * gpus / 64
    dd, rng = DataDir(root), np.random.default_rng(1)
    energy0 = np.full(gpus, 1e7)
    spans = points = seq = 0
    step = bench.HOUR_NS // 60
    for lo in range(hour, hour + bench.HOUR_NS, step):
        for frame, table in ((bench.make_spans(rng, lo, lo + step), t.SPANS),
                             (bench.make_points(rng, lo, lo + step, energy0), t.METRIC_POINTS)):
            seq += 1
            write_parquet_atomic(frame, dd.raw_segment_path(t.table(table).raw_signal, hour,
                                                            "gen", seq))
            spans += frame.height if table == t.SPANS else 0
            points += frame.height if table == t.METRIC_POINTS else 0
    return spans, points


def _task(mode: str, files: dict | list, hour: int, shards: list, mapping: str, data: str = "",
          rows: dict | None = None, pieces: str = "", stage: str = "", keep: str = "") -> dict:
    args = json.dumps({"mode": mode, "files": files, "hour": hour, "mapping": mapping,
                       "data": data, "rows": rows or {}, "pieces": pieces, "stage": stage,
                       "keep": keep,
                       "shards": [[s.index, s.count, list(s.hosts), s.rest] for s in shards]})
    out = subprocess.run([sys.executable, "-c", _TASK.format(repo=str(REPO), args=args)],
                         capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(bench: ModuleType, gpus: int, shard_rows: int, unsharded_max: int) -> dict:
    """Generate one hour of ``gpus`` GPUs and run its phase-1 tasks; their peaks."""
    from dataclasses import replace

    from fleetlens.pipeline.config import PipelineConfig
    from fleetlens.pipeline.discovery import discover
    from fleetlens.pipeline.phases import phase1_files
    from fleetlens.pipeline.shardreduce import merge_by_host
    from fleetlens.pipeline.shards import Shard, plan_hour
    from fleetlens.pipeline.state import PipelineState
    from fleetlens.pipeline.storage import DataDir

    cfg = replace(PipelineConfig(), shard_rows=shard_rows)
    with tempfile.TemporaryDirectory(prefix="fleetlens-mem-") as tmp:
        root = Path(tmp) / "data"
        hour = (1_790_000_000 * bench.NS) // bench.HOUR_NS * bench.HOUR_NS
        spans, points = generate(bench, root, gpus, hour)
        dd, state = DataDir(root), PipelineState()
        discover(dd, state, int(cfg.max_sample_gap_s * bench.NS), cfg.lateness_s * bench.NS)
        files = phase1_files(state, dd, cfg, hour)
        shards = plan_hour(state, cfg, hour)
        rows = {str(root / rel): seg.rows for rel, seg in state.segments.items()}
        split_dir = Path(tmp) / "pieces"
        split_dir.mkdir()
        split = (_task("split", files, hour, shards, "", rows=rows, pieces=str(split_dir))
                 if len(shards) > 1 else None)
        runs: dict[str, tuple[list, list]] = {}
        halves = [str(Path(tmp) / f"half-{i}.pickle") for i in range(2 * len(shards))]
        # With several shards: the halves from the split's pieces (as the runners run them
        # now), then reading the raw segments themselves (as before the split), for the CPU.
        for how, where in (("split", str(split_dir) if split else ""), ("read", "")):
            if how == "read" and not split:
                break
            mappings, point_runs, span_runs = [], [], []
            stage = str(Path(tmp) / f"stage-{how}")  # the halves stage their tables there
            for shard in shards:
                path = str(Path(tmp) / f"mapping-{shard.index}.parquet")
                point_runs.append(_task("points", files, hour, [shard], path, pieces=where,
                                        stage=stage, keep=halves[shard.index]))
                mappings.append(pl.read_parquet(path))
            mapping = str(Path(tmp) / "mapping.parquet")
            merge_by_host(mappings).write_parquet(mapping)
            for shard in shards:
                span_runs.append(_task("spans", files, hour, [shard], mapping, pieces=where,
                                       stage=stage, keep=halves[len(shards) + shard.index]))
            runs[how] = point_runs, span_runs
            if how == "split":  # the merge task over the halves just staged
                merge1 = _task("phase1merge", halves, hour, shards, "", stage=stage)
        whole = _task("hour", files, hour, shards, mapping, str(root), rows=rows)
        phase2 = (_task("phase2", files, hour, shards, mapping, str(root))
                  if gpus <= unsharded_max else None)
        # Phase 2 sharded: each shard's map task, then the reduce over their results.
        results = [str(Path(tmp) / f"phase2-{s.index}.pickle") for s in shards]
        maps = [_task("phase2shard", files, hour, [s], path, str(root))
                for s, path in zip(shards, results, strict=True)]
        merge = _task("phase2merge", results, hour, shards, "", str(root))
        single = (_task("hour", files, hour, [Shard(0, 1)], mapping)
                  if gpus <= unsharded_max else None)
    point_runs, span_runs = runs["split"]
    read = runs.get("read")
    return {"gpus": gpus, "spans": spans, "points": points, "shards": len(shards),
            "hosts_per_shard": len(shards[0].hosts) if len(shards) > 1 else gpus // 4,
            "split_task_mb": split and split["rss_mb"], "split_cpu_s": split and split["cpu_s"],
            "points_task_mb": max(r["rss_mb"] for r in point_runs),
            "phase1_merge_mb": merge1["rss_mb"], "phase1_merge_cpu_s": merge1["cpu_s"],
            "spans_task_mb": max(r["rss_mb"] for r in span_runs),
            "task_cpu_s": sum(r["cpu_s"] for r in point_runs + span_runs)
            + (split["cpu_s"] if split else 0.0),
            "read_task_cpu_s": read and sum(r["cpu_s"] for r in read[0] + read[1]),
            "hour_mb": whole["rss_mb"], "hour_cpu_s": whole["cpu_s"],
            "phase2_mb": phase2 and phase2["rss_mb"],
            "phase2_cpu_s": phase2 and phase2["cpu_s"],
            "phase2_map_mb": max(r["rss_mb"] for r in maps),
            "phase2_map_cpu_s": sum(r["cpu_s"] for r in maps),
            "phase2_merge_mb": merge["rss_mb"], "phase2_merge_cpu_s": merge["cpu_s"],
            "unsharded_mb": single and single["rss_mb"],
            "unsharded_cpu_s": single and single["cpu_s"]}


def _split(r: dict) -> str:
    """The split task's share, and the halves' CPU when each read the raw segments itself."""
    if not r["split_task_mb"]:
        return ""
    return (f", the split task {r['split_task_mb']:.0f} MiB and {r['split_cpu_s']:.1f} of them; "
            f"each shard reading the raw segments itself: {r['read_task_cpu_s']:.1f} CPU-s")


def report(rows: list[dict]) -> None:
    """One line per fleet size, then the spread of the per-task peaks."""
    for r in rows:
        unsharded = (f"{r['unsharded_mb']:.0f} MiB, {r['unsharded_cpu_s']:.1f} CPU-s"
                     if r["unsharded_mb"] else "not run")
        print(f"{r['gpus']:5d} GPUs ({r['spans']:,} spans, {r['points']:,} points): "
              f"{r['shards']} shard(s) of {r['hosts_per_shard']} hosts; peak per task: point "
              f"half {r['points_task_mb']:.0f} MiB, span half {r['spans_task_mb']:.0f} MiB "
              f"({r['task_cpu_s']:.1f} CPU-s in all{_split(r)}); merge task "
              f"{r['phase1_merge_mb']:.0f} MiB ({r['phase1_merge_cpu_s']:.1f} CPU-s); "
              f"the whole hour on one thread "
              f"{r['hour_mb']:.0f} MiB ({r['hour_cpu_s']:.1f} CPU-s); unsharded {unsharded}; "
              f"phase 2: shard task {r['phase2_map_mb']:.0f} MiB "
              f"({r['phase2_map_cpu_s']:.1f} CPU-s in all), reduce task "
              f"{r['phase2_merge_mb']:.0f} MiB ({r['phase2_merge_cpu_s']:.1f} CPU-s), "
              f"unsharded {_phase2(r)}",
              flush=True)
    peaks = [max(r["points_task_mb"], r["spans_task_mb"], r["split_task_mb"] or 0)
             for r in rows]
    print(f"phase 1: largest task peak / smallest across the fleet sizes: "
          f"{max(peaks) / min(peaks):.2f} (target <= 1.5)")
    merges = [r["phase1_merge_mb"] for r in rows]
    print(f"phase 1 merge task: largest peak / smallest across the fleet sizes: "
          f"{max(merges) / min(merges):.2f} (target <= 1.5)")
    for name, key in (("shard", "phase2_map_mb"), ("reduce", "phase2_merge_mb")):
        peaks = [r[key] for r in rows]
        print(f"phase 2 {name} task: largest peak / smallest across the fleet sizes: "
              f"{max(peaks) / min(peaks):.2f} (target <= 1.5)")


def _phase2(r: dict) -> str:
    """The unsharded phase 2 of the hour (one task), where it was run."""
    if not r["phase2_mb"]:
        return "not run"
    return f"{r['phase2_mb']:.0f} MiB ({r['phase2_cpu_s']:.1f} CPU-s)"
