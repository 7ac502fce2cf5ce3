"""No blind warm-up for a newcomer (issue 30 item 2): a host joining a running fleet with a
fault in its first minutes, found or missed, with and without its peers' band.

Takes a fleet64 run that ``bench/warmup.py --keep DIR`` simulated (the real collector and
pipeline), and for each incident on one host (or one GPU of it) makes that host a newcomer:
its requests, engine and GPU samples before ``--joins`` seconds ahead of the fault are
dropped and the `windows` rebuilt by the pipeline's own stage, so the host's first window
comes that long before its fault, beside its peers (the same model on the same GPU model)
that ran all along. Each case is analysed with the defaults (a young window borrows its
peers' band, analytics.peer_bands) and with ``warmup_peer_bands = False`` (the rules
before: blind until its own warm-up band). Prints, per case, whether the fault was found
on its host, its top cause and when it was detected, and the incidents on the newcomer
that match no injected fault.

Usage: ``.venv/bin/python bench/warmup_newcomer.py DIR [--joins 120] [--cases 3]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import polars as pl  # noqa: E402

from fleetlens.analytics.analyse import analyse  # noqa: E402
from fleetlens.analytics.attribution import Tables  # noqa: E402
from fleetlens.analytics.config import AnalyticsConfig  # noqa: E402
from fleetlens.pipeline.schema import columns as c  # noqa: E402
from fleetlens.pipeline.schema.causes import parse_subject  # noqa: E402
from fleetlens.pipeline.storage import DataDir  # noqa: E402
from fleetlens.pipeline.windows import windows  # noqa: E402

TRUTH = "ground-truth.json"


def _host(subject: str, gpu_hosts: dict[str, str]) -> str | None:
    """The host an injected fault's subject names (``host_name=h03``, or a GPU's host)."""
    key, value = parse_subject(subject)
    if key == c.HOST_NAME:
        return value
    return gpu_hosts.get(value) if key == c.GPU_UUID else None


def newcomer(full: dict[str, pl.DataFrame], host: str, cut_ns: int, window_s: int) -> Tables:
    """``full`` (collected tables) as if ``host`` had started serving at ``cut_ns``."""
    def keep(frame: pl.DataFrame, ts: str) -> pl.DataFrame:
        return frame.filter((pl.col(c.HOST_NAME) != host) | (pl.col(ts) >= cut_ns))

    requests = keep(full["requests"], c.ARRIVAL_NS)
    engine = keep(full["engine_samples"], c.TS_NS)
    gpus = keep(full["gpu_samples"], c.TS_NS)
    energy = keep(full["windows"].filter(pl.col(c.WINDOW_S) == window_s),
                  c.WINDOW_START_NS).select(c.WINDOW_START_NS, c.SERVICE_NAME, c.MODEL,
                                            c.HOST_NAME, c.ENERGY_J, c.POWER_W)
    rebuilt = windows(requests, engine, energy, window_s)
    return Tables.from_frames(requests, engine, gpus, rebuilt, full["instance_gpus"])


def _case(tables: Tables, config: AnalyticsConfig, fault: dict, host: str) -> str:
    result = analyse(tables, config)
    ranked = result.incidents.join(result.causes.filter(pl.col(c.RANK) == 1),
                                   on=c.INCIDENT_ID, how="left")
    on_host = ranked.filter(pl.col(c.HOST_NAME) == host)
    hit = on_host.filter((pl.col(c.START_NS) < fault[c.END_NS])
                         & (pl.col(c.END_NS) > fault[c.START_NS])).sort(c.DETECTED_NS)
    other = on_host.height - hit.height
    if hit.is_empty():
        return f"missed; {other} other incident(s) on {host}"
    row = hit.row(0, named=True)
    after = (row[c.DETECTED_NS] - fault[c.START_NS]) / 60e9
    return (f"found, detected {after:.1f} min after its start, top cause {row[c.CAUSE]} "
            f"{row[c.SUBJECT]} ({row[c.METRIC]}, {row[c.DETECTOR]}); {other} other "
            f"incident(s) on {host}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("workdir", type=Path, help="a folder bench/warmup.py --keep left")
    parser.add_argument("--joins", type=int, default=120,
                        help="the newcomer's first window, seconds before its fault")
    parser.add_argument("--cases", type=int, default=3, help="host faults tried, in order")
    args = parser.parse_args()
    truth = json.loads((args.workdir / TRUTH).read_text())["incidents"]
    tables = Tables.from_data_dir(DataDir(args.workdir / "data"))
    full = {name: getattr(tables, name).collect()
            for name in ("requests", "engine_samples", "gpu_samples", "windows")}
    full["instance_gpus"] = tables.instance_gpus
    config = AnalyticsConfig()
    gpu_hosts = dict(full["gpu_samples"].select(c.GPU_UUID, c.HOST_NAME).unique().iter_rows())
    ordered = sorted(truth, key=lambda f: f[c.START_NS])
    faults = [(f, _host(f["subject"], gpu_hosts)) for f in ordered]
    faults = [(f, h) for f, h in faults if h is not None][:args.cases]
    for fault, host in faults:
        cut = fault[c.START_NS] - args.joins * 1_000_000_000
        case = newcomer(full, host, cut, config.window_s)
        print(f"\n{fault['cause']} on {fault['subject']}: {host} joins "
              f"{args.joins} s before it")
        print(f"  peer band (defaults):      {_case(case, config, fault, host)}")
        blind = dataclasses.replace(config, warmup_peer_bands=False)
        print(f"  no peer band (rules before): {_case(case, blind, fault, host)}")


if __name__ == "__main__":
    main()
