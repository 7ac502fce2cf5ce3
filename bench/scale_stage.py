"""What the bounded merges cost (``bench/scale.py --stage-cost``; issue 36): one generated
hour of an N-GPU fleet run by the local runner (``Pipeline.run_once(full=True)``) with its
shards' tables staged and merged a range at a time (as it runs now: docs/architecture.md,
"Bounded merges") against the same shards merged in memory in one range (as before: each
merge holds the hour), each run a process of its own, the two taking turns. Prints CPU-s,
wall and peak RSS medians, their ratios, and whether the files were the same bytes.
Split from ``bench/scale.py``, which loads it and passes it ``bench/pipeline.py`` and
``bench/scale_memory.py`` as modules (``bench`` is no package).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]

#: Put before every measured script (not a template): ``measure(work, data)`` runs ``work``
#: and returns its result with the process's CPU-s, wall, peak RSS and a digest of every
#: output file's bytes under ``data``.
MEASURE = """
import hashlib, resource, time
from pathlib import Path


def measure(work, data):
    from fleetlens.pipeline import runner
    from fleetlens.pipeline.storage import DataDir, parquet_files
    began = time.perf_counter()
    result = work()
    wall = time.perf_counter() - began
    use = resource.getrusage(resource.RUSAGE_SELF)
    hwm = next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM"))
    digest = hashlib.sha256()
    for table in runner.OUTPUTS:
        for path in parquet_files(DataDir(Path(data)).derived(table)):
            digest.update(str(path.relative_to(data)).encode() + path.read_bytes())
    return result, {"cpu_s": use.ru_utime + use.ru_stime, "wall_s": wall,
                    "rss_mb": hwm / 1024, "digest": digest.hexdigest()}
"""

_RUN = """
import json, sys
from dataclasses import replace
sys.path.insert(0, {repo!r})
from fleetlens.pipeline import phase2, runner
from fleetlens.pipeline.config import PipelineConfig
from fleetlens.pipeline.storage import DataDir
args = json.loads({args!r})
cfg = PipelineConfig()
if not args["staged"]:  # as before the bounded merges: nothing staged, one range in memory
    runner.staging_folder = phase2.staging_folder = lambda *_: None
    cfg = replace(cfg, reduce_rows=10**12)
_, measured = measure(lambda: runner.Pipeline(DataDir(args["data"]), cfg).run_once(full=True),
                     args["data"])
print(json.dumps(measured))
"""


def run_process(script: str, args: dict) -> dict:
    """Run ``script`` (a template taking ``repo`` and ``args``, :data:`MEASURE` defined before
    it) in a process of its own; the JSON object its last line prints."""
    code = MEASURE + script.format(repo=str(REPO), args=json.dumps(args))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=False)
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def medians(runs: dict[str, list[dict]]) -> tuple[dict, bool]:
    """Per setup the median CPU-s, wall and peak of its runs, and whether every run of
    every setup wrote the same bytes."""
    med = {label: {key: statistics.median(r[key] for r in rs)
                   for key in ("cpu_s", "wall_s", "rss_mb")} for label, rs in runs.items()}
    return med, len({r["digest"] for rs in runs.values() for r in rs}) == 1


def ratios(one: dict, other: dict) -> str:
    """``one`` against ``other`` (two setups' :func:`medians`): CPU, wall and peak."""
    return (f"CPU {one['cpu_s'] / other['cpu_s']:.2f}, wall {one['wall_s'] / other['wall_s']:.2f}"
            f", peak {one['rss_mb'] / other['rss_mb']:.2f}")


def _run(data: Path, staged: bool) -> dict:
    return run_process(_RUN, {"data": str(data), "staged": staged})


def stage_cost(args: argparse.Namespace, bench: ModuleType, scale_memory: ModuleType) -> dict:
    """Generate one hour of each ``--gpus`` fleet size and time the local runner over it,
    staged and in memory taking turns, ``--repeat`` runs each."""
    results = {}
    for gpus in args.gpus:
        with tempfile.TemporaryDirectory(prefix="fleetlens-stage-") as tmp:
            raw = Path(tmp) / "raw"
            hour = (1_790_000_000 * bench.NS) // bench.HOUR_NS * bench.HOUR_NS
            spans, points = scale_memory.generate(bench, raw, gpus, hour)
            runs: dict[str, list[dict]] = {"staged": [], "in memory": []}
            for _ in range(args.repeat):
                for label in runs:
                    data = Path(tmp) / "data"
                    shutil.copytree(raw, data)  # the raw segments alone, every run
                    runs[label].append(_run(data, label == "staged"))
                    shutil.rmtree(data)
        med, same = medians(runs)
        staged, memory = med["staged"], med["in memory"]
        print(f"{gpus} GPUs ({spans:,} spans, {points:,} points), medians of {args.repeat}: "
              f"staged {staged['cpu_s']:.1f} CPU-s, {staged['wall_s']:.1f} s, "
              f"{staged['rss_mb']:,.0f} MiB; in memory {memory['cpu_s']:.1f} CPU-s, "
              f"{memory['wall_s']:.1f} s, {memory['rss_mb']:,.0f} MiB; staged / in memory: "
              f"{ratios(staged, memory)}; same bytes: {same}", flush=True)
        results[gpus] = {"medians": med, "identical": same,
                         "runs": {k: [round(r["cpu_s"], 2) for r in v] for k, v in runs.items()}}
    return results
