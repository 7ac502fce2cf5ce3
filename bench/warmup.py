"""No blind warm-up (issue 30 item 2): a fresh fleet's first incidents, found or missed.

Simulates ``simulator/scenarios/fleet64.toml`` (an incident every 5 minutes from minute 5)
once through the real collector and pipeline, then analyses the same data twice: with the
defaults (the warm-up band) and with ``warmup_min_windows = None`` (no band before 20
windows, the rules before). Prints each run's score against the ground truth and the first
incidents with their top cause.

Usage: ``.venv/bin/python bench/warmup.py [--seed 11] [--keep DIR | --rescore DIR]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import polars as pl  # noqa: E402

from bench.end_to_end import run_analytics, run_end_to_end  # noqa: E402
from fleetlens.analytics.accuracy import score_run  # noqa: E402
from fleetlens.analytics.config import AnalyticsConfig  # noqa: E402
from fleetlens.pipeline.schema import columns as c  # noqa: E402
from fleetlens.pipeline.storage import DataDir  # noqa: E402

SCENARIO = REPO / "simulator" / "scenarios" / "fleet64.toml"
TRUTH = "ground-truth.json"


def _simulate(seed: int, workdir: Path) -> list[dict]:
    doc = tomllib.loads(SCENARIO.read_text())
    doc["fleet"]["seed"] = seed
    truth, _, timings = run_end_to_end(doc, workdir)
    (workdir / TRUTH).write_text(json.dumps(truth))
    print(f"simulated fleet64 seed {seed} into {workdir}: "
          + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()))
    return truth["incidents"]


def _report(label: str, workdir: Path, truth: list[dict], config: AnalyticsConfig) -> None:
    analysis = run_analytics(DataDir(workdir / "data"), config, notify=False).analysis
    score = score_run(truth, analysis.incidents, analysis.causes)
    print(f"\n{label}: {score.detected} of {score.injected} found, top-1 {score.top1}, "
          f"subject {score.subject}, false {score.false_incidents}")
    for miss in score.misses:
        print(f"  {miss}")
    t0 = min(item["start_ns"] for item in truth)
    first = (analysis.incidents.join(analysis.causes.filter(pl.col(c.RANK) == 1),
                                     on=c.INCIDENT_ID)
             .sort(c.START_NS).head(5))
    for row in first.iter_rows(named=True):
        minute = (row[c.START_NS] - t0) / 60e9 + 5  # the first incident is at minute 5
        print(f"  minute {minute:5.1f}: {row[c.CAUSE]} {row[c.SUBJECT]} "
              f"({row[c.DETECTOR]})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seed", type=int, default=11, help="simulator seed")
    parser.add_argument("--keep", type=Path, default=None, help="simulate into this folder")
    parser.add_argument("--rescore", type=Path, default=None,
                        help="analyse a folder a --keep run left, without simulating")
    args = parser.parse_args()
    if args.rescore is not None:
        workdir = args.rescore
        truth = json.loads((workdir / TRUTH).read_text())["incidents"]
    else:
        workdir = args.keep or Path(tempfile.mkdtemp(prefix="fleetlens-warmup-"))
        workdir.mkdir(parents=True, exist_ok=True)
        truth = _simulate(args.seed, workdir)
    _report("warm-up band (defaults)", workdir, truth, AnalyticsConfig())
    _report("no band before 20 windows (warmup_min_windows = None)", workdir, truth,
            dataclasses.replace(AnalyticsConfig(), warmup_min_windows=None))


if __name__ == "__main__":
    main()
