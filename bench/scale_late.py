"""What late data from one host costs (``bench/scale.py --late-host``; issue 36): one generated
hour of an N-GPU fleet, the last ten minutes of one host's metric points held back, run by the
local runner; then those points arrive as a late segment and the incremental run that follows
is timed three ways, each run a process of its own from the same prepared copy, taking turns:
recomputing only the dirty host in both phases and keeping the others' results (``kept``:
``pipeline/dirtyhosts.py`` and ``pipeline/phase2kept.py``, as it runs now), in phase 1 only
(``phase1``: phase 2 of a dirty hour recomputing every host, as in the last release), and
every host in both (``all``). Prints CPU-s, wall and peak RSS medians, their ratios against
``all``, and whether the files were the same bytes.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]

_RUN = """
import json, sys
sys.path.insert(0, {repo!r})
from fleetlens.pipeline import phase2kept, runner
from fleetlens.pipeline.config import PipelineConfig
from fleetlens.pipeline.storage import DataDir
args = json.loads({args!r})
if args["mode"] != "kept":  # phase 2 of a dirty hour recomputes every host
    phase2kept.plan_kept = lambda *_: None
if args["mode"] == "all":  # and so does phase 1
    runner.phase1_kept = lambda *_: None
pipeline = runner.Pipeline(DataDir(args["data"]), PipelineConfig(lateness_s=3600))
summary, measured = measure(pipeline.run_once, args["data"])
print(json.dumps({{**measured, "kept": summary.kept_host_hours,
                   "kept2": summary.kept_host_hours_phase2, "dirty": summary.dirty_hours}}))
"""


def hold_back(raw: Path, hour: int, minutes: int = 10) -> tuple[str, object]:
    """Take the first host's metric points of the hour's last ``minutes`` out of their
    segments (rewritten without them); return the host and those points."""
    import polars as pl

    from fleetlens.pipeline.schema import columns as c
    from fleetlens.pipeline.storage import write_parquet_atomic

    files = sorted((raw / "raw" / "metrics").rglob("*.parquet"))
    host = pl.read_parquet(files[0], columns=[c.HOST_NAME]).get_column(c.HOST_NAME).min()
    since = hour + (60 - minutes) * 60 * 10**9
    held = []
    for path in files:
        frame = pl.read_parquet(path)
        late = (pl.col(c.HOST_NAME) == host) & (pl.col(c.TS_NS) >= since)
        if frame.select(late.any()).item():
            held.append(frame.filter(late))
            write_parquet_atomic(frame.filter(~late), path)
    return host, pl.concat(held)


def late_cost(args: argparse.Namespace, bench: ModuleType, scale_memory: ModuleType,
              stage: ModuleType) -> dict:
    """Generate one hour of each ``--gpus`` fleet size, hold one host's last minutes back, run,
    then time the incremental run after they arrive: kept against all recomputed (each run a
    process, :func:`scale_stage.run_process`)."""
    from fleetlens.pipeline.config import PipelineConfig
    from fleetlens.pipeline.runner import Pipeline
    from fleetlens.pipeline.schema import tables as t
    from fleetlens.pipeline.storage import DataDir, write_parquet_atomic

    results = {}
    for gpus in args.gpus:
        with tempfile.TemporaryDirectory(prefix="fleetlens-late-") as tmp:
            base = Path(tmp) / "base"
            hour = (1_790_000_000 * bench.NS) // bench.HOUR_NS * bench.HOUR_NS
            spans, points = scale_memory.generate(bench, base, gpus, hour)
            host, held = hold_back(base, hour)
            Pipeline(DataDir(base), PipelineConfig(lateness_s=3600)).run_once()
            runs: dict[str, list[dict]] = {"kept": [], "phase1": [], "all": []}
            for _ in range(args.repeat):
                for label in runs:
                    data = Path(tmp) / "data"
                    shutil.copytree(base, data)
                    dd = DataDir(data)
                    write_parquet_atomic(held, dd.raw_segment_path(
                        t.table(t.METRIC_POINTS).raw_signal, hour, "late", 1))
                    runs[label].append(stage.run_process(
                        _RUN, {"data": str(data), "mode": label}))
                    shutil.rmtree(data)
        med, same = stage.medians(runs)
        every, first = med["all"], runs["kept"][0]

        def figures(m: dict) -> str:
            return f"{m['cpu_s']:.1f} CPU-s, {m['wall_s']:.1f} s, {m['rss_mb']:,.0f} MiB"

        print(f"{gpus} GPUs ({spans:,} spans, {points:,} points; {held.height:,} late points "
              f"of {host}), medians of {args.repeat}: kept {figures(med['kept'])} "
              f"({first['kept']} host-hours kept in phase 1, {first['kept2']} in phase 2, of "
              f"{first['dirty']} dirty hours); phase 1 only {figures(med['phase1'])}; all "
              f"recomputed {figures(every)}; kept / all: {stage.ratios(med['kept'], every)}; "
              f"phase 1 only / all: {stage.ratios(med['phase1'], every)}; same bytes: {same}",
              flush=True)
        results[gpus] = {"medians": med, "identical": same,
                         "runs": {k: [round(r["cpu_s"], 2) for r in v] for k, v in runs.items()}}
    return results
