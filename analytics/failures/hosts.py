"""Hosts gone silent: the agent's samples stopped while other hosts kept reporting.

The agent sends GPU samples and engine scrapes together (and a heartbeat), so a host whose
rows in `gpu_samples` and `engine_samples` stop has lost its agent. What its engines did
tells which: when their request spans still arrive, only the telemetry is gone
(``telemetry_gap``); when nothing arrives, the host is (``host_down``).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from fleetlens.analytics.failures.config import FailureConfig
from fleetlens.analytics.failures.findings import LEVEL_HOST, Finding
from fleetlens.pipeline.normalize import SOURCE_GATEWAY
from fleetlens.pipeline.schema import FLEET_WIDE, Cause
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema.causes import subject

NS = 1_000_000_000
_EDGE_NS = 10 * NS


def presence(gpu: pl.LazyFrame, engine: pl.LazyFrame) -> pl.DataFrame:
    """(host_name, ts_ns) of every agent report, one row per host and second."""
    parts = [frame.select(c.HOST_NAME, (pl.col(c.TS_NS) // NS * NS).alias(c.TS_NS))
             for frame in (gpu, engine)]
    return pl.concat(parts).unique().sort(c.HOST_NAME, c.TS_NS).collect()


def silences(seen: pl.DataFrame, requests: pl.LazyFrame, host_services: dict[str, str],
             cfg: FailureConfig) -> list[Finding]:
    """Gaps longer than ``silent_after_s`` in a host's reports while others reported."""
    if seen.is_empty():
        return []
    limit = int(cfg.silent_after_s * NS)
    last = int(seen.get_column(c.TS_NS).max())
    out = []
    for (host,), rows in seen.partition_by(c.HOST_NAME, as_dict=True,
                                           maintain_order=True).items():
        ts = rows.get_column(c.TS_NS).to_numpy()
        others = np.unique(seen.filter(pl.col(c.HOST_NAME) != host)
                           .get_column(c.TS_NS).to_numpy())
        bounds = np.append(ts, last)  # a host silent until the end: its gap is still open
        for i in np.flatnonzero(np.diff(bounds) > limit):
            lo, hi = int(bounds[i]), int(bounds[i + 1])
            ongoing = bool(i + 1 == len(ts))
            # others must have reported after this host's silence became a finding
            if np.searchsorted(others, lo + limit, "left") == np.searchsorted(others, hi, "left"):
                continue
            out.append(_finding(str(host), lo, hi, ongoing, requests, host_services, cfg))
    return out


def _finding(host: str, last_seen: int, back: int, ongoing: bool, requests: pl.LazyFrame,
             host_services: dict[str, str], cfg: FailureConfig) -> Finding:
    # Requests finishing right at the edges were on their way when the host went or came:
    # only those the silence's interior saw tell a running host from a lost one.
    edge = min(_EDGE_NS, int(cfg.silent_after_s * NS) // 4)
    served = (requests.filter((pl.col(c.HOST_NAME) == host)
                              & (pl.col(c.SOURCE) != SOURCE_GATEWAY)
                              & pl.col(c.END_NS).is_between(last_seen + edge, back - edge))
              .select(pl.len()).collect().item())
    start = last_seen + NS  # the first second it should have reported and did not
    seconds = (back - last_seen) / NS
    still = " (still silent)" if ongoing else ""
    if served:
        cause = Cause.TELEMETRY_GAP
        summary = (f"the agent of {host} sent nothing for {seconds:.0f} s{still} while its "
                   f"engines served {served} requests: telemetry lost, service running")
    else:
        cause = Cause.HOST_DOWN
        summary = (f"nothing arrived from {host} for {seconds:.0f} s{still}: no agent report "
                   "and no request span")
    return Finding(cause, subject(c.HOST_NAME, host), host_services.get(host, FLEET_WIDE), "",
                   host, start, back, last_seen + int(cfg.silent_after_s * NS), "silent_s",
                   seconds, 0.0, summary, LEVEL_HOST,
                   {"last_report_ns": last_seen, "silent_s": seconds, "ongoing": ongoing,
                    "requests_served_meanwhile": served})
