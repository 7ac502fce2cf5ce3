"""Analytics timings on the 2-core machine (DESIGN.md section 7 budgets).

Usage: ``.venv/bin/python bench/analytics.py [--rps-per-gpu 1.0] [--runs 3] [--skip-prophet]``

1. One simulated day of a 64-GPU fleet (8 hosts x 8 GPUs, synthetic tables with six injected
   incidents): baselines + detection + attribution, median of ``--runs``; beside it, in the
   same run, one Polars pass computing p99 e2e per host and minute over the same requests
   (the floor any per-window analysis pays) as the peer.
2. ``fleetlens explain`` (report build + text render) for one of those incidents from the
   data directory on disk, median of 5.
3. Rolling median/MAD baselines for 1,000 series of one day at one-minute windows.
4. Prophet on 1,000 five-minute series (2 days each) with both cores (run once).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from fleetlens.analytics.analyse import analyse  # noqa: E402
from fleetlens.analytics.attribution import Tables  # noqa: E402
from fleetlens.analytics.baselines import rolling_baseline  # noqa: E402
from fleetlens.analytics.config import AnalyticsConfig  # noqa: E402
from fleetlens.analytics.report import build_report  # noqa: E402
from fleetlens.analytics.report_render import to_text  # noqa: E402
from fleetlens.analytics.runner import run  # noqa: E402
from fleetlens.pipeline.schema import columns as c  # noqa: E402
from fleetlens.pipeline.storage import DataDir  # noqa: E402
from tests.analytics.synthetic import FleetSpec, Injected, generate  # noqa: E402
from tests.analytics.synthetic_io import write_tables  # noqa: E402

NS = 1_000_000_000
H = 3600


def timed(fn, runs: int) -> tuple[float, object]:  # noqa: ANN001
    times, out = [], None
    for _ in range(runs):
        started = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times), out


def day_of_fleet(rps_per_gpu: float):  # noqa: ANN201
    gpu = "GPU-{h:04x}{g:04x}-0000-0000-0000-{n:012x}"
    incidents = [
        Injected("thermal_throttle", "gpu_uuid=" + gpu.format(h=2, g=3, n=2 * 64 + 3), 3 * H,
                 1200),
        Injected("traffic_surge", "service_name=chat", 7 * H, 900),
        Injected("kv_cache_pressure", "host_name=h05", 11 * H, 900),
        Injected("prefix_cache_drop", "service_name=chat", 15 * H, 900),
        Injected("slow_gpu", "gpu_uuid=" + gpu.format(h=6, g=1, n=6 * 64 + 1), 18 * H, 900),
        Injected("network_overhead", "service_name=chat", 21 * H, 900),
    ]
    spec = FleetSpec(hosts=8, gpus_per_host=8, duration_s=24 * H, rps_per_instance=rps_per_gpu,
                     daily_amplitude=0.3, seed=64)
    return generate(spec, incidents)


def fleet_day(args: argparse.Namespace, workdir: Path) -> None:
    started = time.perf_counter()
    data = day_of_fleet(args.rps_per_gpu)
    print(f"[1] synthetic day: {data.requests.height:,} requests, {data.windows.height:,} "
          f"windows, {data.gpu_samples.height:,} GPU samples (generated in "
          f"{time.perf_counter() - started:.1f} s)")
    tables = Tables.from_frames(data.requests, data.engine_samples, data.gpu_samples,
                                data.windows, data.instance_gpus)
    config = AnalyticsConfig()
    took, result = timed(lambda: analyse(tables, config), args.runs)
    step = 60 * NS
    peer, _ = timed(lambda: data.requests.group_by(
        (pl.col(c.ARRIVAL_NS) // step).alias("m"), c.HOST_NAME).agg(
        pl.col(c.E2E_S).quantile(0.99)), args.runs)
    print(f"    baselines + detection + attribution: median {took:.2f} s over {args.runs} runs "
          f"(budget 10 s); {result.banded[c.SERIES].n_unique():,} series, "
          f"{result.incidents.height} incidents, {result.causes.height} causes")
    print(f"    peer: one Polars p99 per host-minute over the requests: {peer:.2f} s "
          f"(ratio {took / peer:.1f}x)")
    top = result.causes.filter(pl.col(c.RANK) == 1).join(
        result.incidents.select(c.INCIDENT_ID, c.START_NS), on=c.INCIDENT_ID).sort(c.START_NS)
    for row in top.iter_rows(named=True):
        print(f"      {(row[c.START_NS] - data.requests[c.ARRIVAL_NS].min()) / NS / H:5.1f} h "
              f"{row[c.CAUSE]:>18} {row[c.SUBJECT]}")
    root = DataDir(workdir / "data")
    write_tables(data, root)
    run(root, config, notify=False)
    ident = result.incidents[c.INCIDENT_ID][0]
    took, text = timed(lambda: to_text(build_report(root, ident)), 5)
    print(f"[2] explain {ident}: median {took * 1000:.0f} ms over 5 runs (budget 1 s); "
          f"{len(text.splitlines())} lines")


def rolling_1000(args: argparse.Namespace) -> None:
    rng = np.random.default_rng(1)
    n, m = 1000, 1440
    frame = pl.DataFrame({
        c.SERIES: np.repeat([f"s{i:04d}" for i in range(n)], m),
        c.TS_NS: np.tile(np.arange(m, dtype=np.int64) * 60 * NS, n),
        c.VALUE: rng.lognormal(0, 0.2, n * m),
    })
    config = AnalyticsConfig()
    took, _ = timed(lambda: rolling_baseline(frame, config).collect(), args.runs)
    one, _ = timed(lambda: rolling_baseline(frame.filter(pl.col(c.SERIES) == "s0000"),
                                            config).collect(), args.runs)
    print(f"[3] rolling median/MAD, 1,000 series x 1,440 windows: median {took:.2f} s "
          f"({took:.2f} ms per series; one series alone {one * 1000:.1f} ms, "
          f"vectorised is {one * n / took:.0f}x faster than 1,000 single-series calls)")


def prophet_1000(args: argparse.Namespace) -> None:
    from fleetlens.analytics.prophet_baselines import fit_prophet

    rng = np.random.default_rng(2)
    n, m = args.prophet_series, 576
    ts = np.arange(m, dtype=np.int64) * 300 * NS + 1_767_225_600 * NS
    daily = 1 + 0.3 * np.sin(2 * np.pi * np.arange(m) / 288)
    frame = pl.DataFrame({
        c.SERIES: np.repeat([f"s{i:04d}" for i in range(n)], m),
        c.TS_NS: np.tile(ts, n),
        c.VALUE: np.tile(daily, n) * rng.lognormal(0, 0.05, n * m),
    })
    config = dataclasses.replace(AnalyticsConfig(), prophet_min_history_s=86400,
                                 prophet_refit_s=3600)
    for workers in (2, 1) if args.prophet_compare else (2,):
        started = time.perf_counter()
        out = fit_prophet(frame, config, workers=workers)
        took = time.perf_counter() - started
        print(f"[4] Prophet, {n:,} five-minute series x 2 days, {workers} worker(s), "
              f"uncertainty_samples={config.prophet_uncertainty_samples}: {took:.1f} s "
              f"({took / n * 1000:.0f} ms per series; budget 120 s for 1,000); "
              f"{out.height:,} rows")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rps-per-gpu", type=float, default=1.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--skip-prophet", action="store_true")
    parser.add_argument("--only", choices=["all", "fleet", "rolling", "prophet"], default="all")
    parser.add_argument("--prophet-series", type=int, default=1000)
    parser.add_argument("--prophet-compare", action="store_true",
                        help="Also time Prophet with one worker (the peer for 2 workers).")
    args = parser.parse_args()
    if args.only in ("all", "fleet"):
        with tempfile.TemporaryDirectory(prefix="fleetlens-bench-analytics-") as tmp:
            fleet_day(args, Path(tmp))
    if args.only in ("all", "rolling"):
        rolling_1000(args)
    if args.only in ("all", "prophet") and not args.skip_prophet:
        prophet_1000(args)


if __name__ == "__main__":
    main()
