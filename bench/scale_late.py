"""What late data from one host costs (``bench/scale.py --late-host``; issue 36): one generated
hour of an N-GPU fleet, the last ten minutes of one host's metric points held back, run by the
local runner; then those points arrive as a late segment and the incremental run that follows
is timed: recomputing only the dirty host's points and keeping the others' published rows
(``pipeline/dirtyhosts.py``, as it runs now) against recomputing every host (as before), each
run a process of its own from the same prepared copy, the two taking turns. Prints CPU-s, wall
and peak RSS medians, their ratios, and whether the files were the same bytes. Phase 2 of the
dirty hours runs in full in both (only phase 1 keeps rows).
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
from fleetlens.pipeline import runner
from fleetlens.pipeline.config import PipelineConfig
from fleetlens.pipeline.storage import DataDir
args = json.loads({args!r})
if not args["kept"]:  # as before: every host of a dirty hour recomputed
    runner.phase1_kept = lambda *_: None
pipeline = runner.Pipeline(DataDir(args["data"]), PipelineConfig(lateness_s=3600))
summary, measured = measure(pipeline.run_once, args["data"])
print(json.dumps({{**measured, "kept": summary.kept_host_hours, "dirty": summary.dirty_hours}}))
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
            runs: dict[str, list[dict]] = {"kept": [], "all": []}
            for _ in range(args.repeat):
                for label in runs:
                    data = Path(tmp) / "data"
                    shutil.copytree(base, data)
                    dd = DataDir(data)
                    write_parquet_atomic(held, dd.raw_segment_path(
                        t.table(t.METRIC_POINTS).raw_signal, hour, "late", 1))
                    runs[label].append(stage.run_process(
                        _RUN, {"data": str(data), "kept": label == "kept"}))
                    shutil.rmtree(data)
        med, same = stage.medians(runs)
        kept, every = med["kept"], med["all"]
        print(f"{gpus} GPUs ({spans:,} spans, {points:,} points; {held.height:,} late points "
              f"of {host}), medians of {args.repeat}: kept {kept['cpu_s']:.1f} CPU-s, "
              f"{kept['wall_s']:.1f} s, {kept['rss_mb']:,.0f} MiB "
              f"({runs['kept'][0]['kept']} host-hours kept of {runs['kept'][0]['dirty']} dirty "
              f"hours); all recomputed {every['cpu_s']:.1f} CPU-s, {every['wall_s']:.1f} s, "
              f"{every['rss_mb']:,.0f} MiB; kept / all: {stage.ratios(kept, every)}; same bytes: "
              f"{same}", flush=True)
        results[gpus] = {"medians": med, "identical": same,
                         "runs": {k: [round(r["cpu_s"], 2) for r in v] for k, v in runs.items()}}
    return results
