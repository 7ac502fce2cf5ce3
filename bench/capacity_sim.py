"""Capacity on random simulated fleets: the fitted knee against the simulator's own.

    python bench/capacity_sim.py SEED [SEED ...] [--workdir DIR] [--residuals]

Per seed: the fleet of :func:`tests.analytics.capacity_sim.capacity_fleet` run end to end
(simulator -> collector -> pipeline -> analytics) into ``DIR/seedN``, and the simulator's
knee measured at steady rates (:mod:`tests.analytics.capacity_truth`, in a fresh
interpreter); both are kept in ``DIR`` and reused, so a changed estimator is judged again on
the same telemetry by rerunning the command (the capacity stage is recomputed from the
stored tables every time). Prints one JSON line per seed: the knee and the arrival rate at the
knee (goodput per GPU is that rate / TP x the attainment the estimator measures in its own
windows, printed; the simulator has no independent attainment, so goodput's error is the
rate's), and the MBU error per window in points. ``--residuals`` also prints each
usable instance-window's TPOT p50 against the steady runs' curve at its batch.

Heavy (a fleet and a sweep of steady runs per seed): run it under
``flock /tmp/fleetlens-heavy.lock``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.end_to_end import run_end_to_end  # noqa: E402
from fleetlens.analytics.attribution import Tables  # noqa: E402
from fleetlens.analytics.capacity.analyse import analyse_capacity  # noqa: E402
from fleetlens.pipeline.schema import columns as c  # noqa: E402
from fleetlens.pipeline.storage import DataDir  # noqa: E402
from tests.analytics.capacity_sim import capacity_fleet, mbu_errors, top_rate  # noqa: E402
from tests.analytics.capacity_truth import in_fresh_interpreter, steady_truth  # noqa: E402
from tests.analytics.test_capacity_sim import CONFIG  # noqa: E402

WINDOW_S = 60


def prepared(seed: int, workdir: Path) -> tuple[DataDir, dict, dict]:
    """Fleet ``seed``'s data directory and steady-rate truth, made once under ``workdir``."""
    doc, drawn = capacity_fleet(seed)
    home = workdir / f"seed{seed}"
    truth_file = home / "truth.json"
    if not (home / "data").exists() or not truth_file.exists():
        shutil.rmtree(home, ignore_errors=True)
        home.mkdir(parents=True)
        run_end_to_end(doc, home, CONFIG)
        truth = in_fresh_interpreter(steady_truth, doc, drawn.tp, top_rate(doc))
        truth_file.write_text(json.dumps(dataclasses.asdict(truth)))
    return DataDir(home / "data"), json.loads(truth_file.read_text()), {
        "pool": f"{drawn.model} {drawn.gpu} tp{drawn.tp}", "tp": drawn.tp}


def estimate(seed: int, workdir: Path, residuals: bool) -> dict:
    """The capacity stage on fleet ``seed``'s stored tables, against its truth."""
    data, truth, drawn = prepared(seed, workdir)
    started = time.perf_counter()
    found = analyse_capacity(Tables.from_data_dir(data), CONFIG, WINDOW_S)
    cost = time.perf_counter() - started
    row = found.capacity.row(0, named=True)
    per_instance = row[c.KNEE_RPS] / row[c.INSTANCES]
    goodput = row[c.GOODPUT_RPS_PER_GPU]
    attained = goodput * drawn["tp"] / per_instance if goodput is not None else None
    windows = found.windows.filter(pl.col(c.REQUESTS) >= 5)
    mbu_error = mbu_errors(data, windows, WINDOW_S)
    out = {"seed": seed, "pool": drawn["pool"], "knee": round(row[c.KNEE_BATCH], 2),
           "true_knee": round(truth["knee_batch"], 2),
           "knee_error": round(row[c.KNEE_BATCH] / truth["knee_batch"] - 1, 4),
           "rps_error": round(per_instance / truth["knee_rps"] - 1, 4),
           "attainment": None if attained is None else round(attained, 4),
           "mbu_points_median": round(100 * float(mbu_error.median()), 2),
           "mbu_points_max": round(100 * float(mbu_error.max()), 2),
           "limit": row[c.KNEE_LIMIT], "extrapolated": row[c.EXTRAPOLATED],
           "stage_s": round(cost, 2)}
    if residuals:
        out["residuals"] = residual_rows(found.windows, truth)
    return out


def residual_rows(windows: pl.DataFrame, truth: dict) -> list[list]:
    """Per usable instance-window: [minute, instance, batch, rps, TPOT p50 ms, the steady
    curve's TPOT p50 at that batch ms, residual %] (the curve: the steady runs' (batch,
    TPOT p50) pairs, interpolated)."""
    runs = sorted((r["batch"], r["tpot_p50"]) for r in truth["runs"])
    xs, ys = np.array([r[0] for r in runs]), np.array([r[1] for r in runs])
    t0 = int(windows[c.WINDOW_START_NS].min())
    rows = []
    for w in windows.filter(pl.col(c.REQUESTS) >= 5).sort(c.WINDOW_START_NS,
                                                           c.INSTANCE_ID).iter_rows(named=True):
        tpot = w[c.percentile_column("tpot", "p50")]
        if tpot is None:
            continue
        steady = float(np.interp(w[c.BATCH], xs, ys))
        rows.append([(w[c.WINDOW_START_NS] - t0) // 10**9 // 60, w[c.INSTANCE_ID][-1],
                     round(w[c.BATCH], 1), round(w[c.RPS], 2), round(tpot * 1e3, 2),
                     round(steady * 1e3, 2), round(100 * (tpot / steady - 1), 1)])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("seeds", type=int, nargs="+")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/fleetlens-capacity-sim"))
    parser.add_argument("--residuals", action="store_true")
    args = parser.parse_args()
    for seed in args.seeds:
        started = time.perf_counter()
        got = estimate(seed, args.workdir, args.residuals)
        got["wall_s"] = round(time.perf_counter() - started, 1)
        print(json.dumps(got), flush=True)


if __name__ == "__main__":
    main()
