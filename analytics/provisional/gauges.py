"""Queues seen on the engines' own gauges (`engine_samples`), before any slow request ends.

A request's span, which carries its TTFT and TPOT, is sent when the request *ends*: a
window's latency is known only once its slow requests finish (25-55 s under KV pressure),
so a span-based incident is posted 4-7 windows after its onset at 10 s windows
(bench/detect_delay.py). The agent scrapes every engine each second; a queue shows there at
once. An engine *breaches* in a sample where

* at least ``min_waiting`` requests wait and at least ``waiting_per_running`` x its running
  batch (a healthy engine's waiting median is 0: no band, an absolute floor), or
* its KV cache is at least ``kv_full`` full while any request waits, or
* its decode slowed with no queue (``decode_ratio``): its TPOT from the gauges, the running
  batch over the tokens generated per second over ``decode_samples`` samples, is at least
  ``decode_ratio`` x its median over the ``decode_baseline_samples`` before them;

and breaching samples in a row for ``hold_s`` are a breach. Breaching engines of a service
that began together (``host_share_for_service`` of its hosts within ``shared_start_s``, as
the span-based merge has it) are one service-level candidate; others are one per host.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from fleetlens.analytics.merge import incident_id
from fleetlens.analytics.provisional.config import ProvisionalConfig
from fleetlens.pipeline.schema import FLEET_WIDE
from fleetlens.pipeline.schema import columns as c

NS = 1_000_000_000
#: A breach whose last sample is older than this before its host's newest sample was missed
#: live (no analysis ran meanwhile): it opens nothing, its spans tell the rest.
RECENT_S = 60
LEVEL_HOST, LEVEL_SERVICE = "host", "service"
_RUN, _BREACH = "_run", "_breach"
#: Per-sample columns: the gauges' TPOT, its recent median, and whether the decode slowed.
TPOT, TPOT_BEFORE, SLOW = "_tpot_s", "_tpot_before_s", "_slow_decode"


@dataclass
class Candidate:
    """One queue seen on the gauges: its scope, its time and what its engines showed."""

    service: str
    model: str
    host: str  # FLEET_WIDE for a service-level candidate
    level: str
    start_ns: int
    end_ns: int
    detected_ns: int
    instances: list[str]
    peak_waiting: float
    expected_waiting: float
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def incident_id(self) -> str:
        """Stable over runs while the queue lasts: scope and first breaching sample."""
        return incident_id(f"{self.service}\x1fprovisional", self.model, self.host,
                           self.start_ns)


def _frame(engine: pl.LazyFrame, since_ns: int) -> pl.DataFrame:
    names = engine.collect_schema().names()
    up = (pl.col(c.UP) != 0).fill_null(True) if c.UP in names else pl.lit(True)
    return (engine.filter(pl.col(c.TS_NS) >= since_ns)
            .select(c.INSTANCE_ID, c.HOST_NAME, c.MODEL, c.TS_NS, c.NUM_WAITING, c.NUM_RUNNING,
                    c.KV_CACHE_USAGE, c.PROMPT_TOKENS_TOTAL, c.GENERATION_TOKENS_TOTAL,
                    up.alias(c.UP))
            .unique([c.INSTANCE_ID, c.TS_NS], keep="first")
            .sort(c.INSTANCE_ID, c.TS_NS).collect())


def _tpot(frame: pl.DataFrame, cfg: ProvisionalConfig) -> pl.DataFrame:
    """The gauges' TPOT per sample (running / generated tokens per second, over
    ``decode_samples``) and its median over the samples before (NaN-free: null where the
    engine generated nothing or restarted)."""
    k = cfg.decode_samples
    gen = pl.col(c.GENERATION_TOKENS_TOTAL).diff(k).over(c.INSTANCE_ID)
    secs = pl.col(c.TS_NS).diff(k).over(c.INSTANCE_ID) / NS
    running = pl.col(c.NUM_RUNNING).fill_null(0).rolling_mean(k).over(c.INSTANCE_ID)
    tpot = pl.when((gen > 0) & (running >= 1)).then(running * secs / gen)
    return frame.with_columns(tpot.alias(TPOT)).with_columns(
        pl.col(TPOT).shift(k).rolling_median(cfg.decode_baseline_samples,
                                             min_samples=cfg.decode_baseline_samples // 2)
        .over(c.INSTANCE_ID).alias(TPOT_BEFORE))


def _flag(frame: pl.DataFrame, cfg: ProvisionalConfig) -> pl.DataFrame:
    frame = _tpot(frame, cfg)
    waiting = pl.col(c.NUM_WAITING).fill_null(0)
    queue = (waiting >= cfg.min_waiting) & (
        waiting >= cfg.waiting_per_running * pl.col(c.NUM_RUNNING).fill_null(0))
    full = (pl.col(c.KV_CACHE_USAGE).fill_null(0) >= cfg.kv_full) & (waiting >= 1)
    slow = pl.lit(False)
    if cfg.decode_ratio > 0:
        slow = (pl.col(TPOT) >= cfg.decode_ratio * pl.col(TPOT_BEFORE)).fill_null(False)
    # a scrape that failed is the failure detectors' business (down, hang), not a queue
    breach = (queue | full | slow) & pl.col(c.UP)
    gap = (pl.col(c.TS_NS).diff().over(c.INSTANCE_ID) > int(cfg.max_gap_s * NS)).fill_null(True)
    changed = (breach != breach.shift(1).over(c.INSTANCE_ID)).fill_null(True)
    return frame.with_columns(breach.alias(_BREACH), (slow & ~queue & ~full).alias(SLOW)
                              ).with_columns(
        (changed | gap).cum_sum().over(c.INSTANCE_ID).alias(_RUN))


def instance_breaches(engine: pl.LazyFrame, end_ns: int, cfg: ProvisionalConfig
                      ) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Breaches per instance over the last ``lookback_s`` before ``end_ns``: one row per
    run of breaching samples that lasted ``hold_s`` and is recent (see :data:`RECENT_S`),
    with its start, last sample, peak waiting, and the samples themselves (for the guess)."""
    frame = _flag(_frame(engine, end_ns - int(cfg.lookback_s * NS)), cfg)
    newest = frame.group_by(c.HOST_NAME).agg(pl.col(c.TS_NS).max().alias("_newest"))
    runs = (frame.filter(pl.col(_BREACH))
            .group_by(c.INSTANCE_ID, _RUN)
            .agg(pl.col(c.HOST_NAME).first(), pl.col(c.MODEL).first(),
                 pl.col(c.TS_NS).min().alias(c.START_NS), pl.col(c.TS_NS).max().alias(c.END_NS),
                 pl.col(c.NUM_WAITING).max().alias(c.PEAK))
            .join(newest, on=c.HOST_NAME)
            .filter((pl.col(c.END_NS) - pl.col(c.START_NS) >= int(cfg.hold_s * NS))
                    & (pl.col(c.END_NS) >= pl.col("_newest") - RECENT_S * NS))
            # the latest qualifying run per instance: an older one was this queue's past
            .sort(c.START_NS).group_by(c.INSTANCE_ID, maintain_order=True).last())
    return runs, frame


def candidates(engine: pl.LazyFrame, services: dict[str, str], end_ns: int,
               cfg: ProvisionalConfig, host_share: float, shared_start_s: float
               ) -> tuple[list[Candidate], pl.DataFrame]:
    """The queues now seen on the gauges, grouped by scope, and the samples they came from.

    Args:
        engine: `engine_samples` (lazy).
        services: the service each instance serves (from its requests).
        end_ns: the newest data (only the last ``lookback_s`` before it is read).
        cfg: the thresholds.
        host_share, shared_start_s: the span-based merge's rule for a service-wide cause.
    """
    runs, frame = instance_breaches(engine, end_ns, cfg)
    if not runs.height:
        return [], frame
    hosts_of: dict[str, set[str]] = {}
    for inst, host in frame.select(c.INSTANCE_ID, c.HOST_NAME).unique().iter_rows():
        hosts_of.setdefault(services.get(inst, FLEET_WIDE), set()).add(host)
    base = frame.filter(~pl.col(_BREACH)).group_by(c.INSTANCE_ID).agg(
        pl.col(c.NUM_WAITING).median().alias(c.EXPECTED))
    rows = runs.join(base, on=c.INSTANCE_ID, how="left").to_dicts()
    by_service: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_service.setdefault(services.get(row[c.INSTANCE_ID], FLEET_WIDE), []).append(row)
    out = []
    for service, mine in sorted(by_service.items()):
        hosts = {r[c.HOST_NAME] for r in mine}
        starts = [r[c.START_NS] for r in mine]
        together = max(starts) - min(starts) <= shared_start_s * NS
        if (service != FLEET_WIDE and len(hosts) >= 2 and together
                and len(hosts) >= host_share * len(hosts_of.get(service, hosts))):
            out.append(_candidate(service, FLEET_WIDE, LEVEL_SERVICE, mine, cfg))
            continue
        for host in sorted(hosts):
            group = [r for r in mine if r[c.HOST_NAME] == host]
            out.append(_candidate(service, host, LEVEL_HOST, group, cfg))
    return out, frame


def _candidate(service: str, host: str, level: str, rows: list[dict[str, Any]],
               cfg: ProvisionalConfig) -> Candidate:
    start = min(r[c.START_NS] for r in rows)
    expected = [r[c.EXPECTED] for r in rows if r[c.EXPECTED] is not None]
    return Candidate(
        service=service, model=rows[0][c.MODEL] or "", host=host, level=level,
        start_ns=start, end_ns=max(r[c.END_NS] for r in rows),
        detected_ns=min(r[c.START_NS] for r in rows) + int(cfg.hold_s * NS),
        instances=sorted(r[c.INSTANCE_ID] for r in rows),
        peak_waiting=float(max(r[c.PEAK] for r in rows)),
        expected_waiting=float(sum(expected)) if expected else 0.0)


__all__ = ["Candidate", "LEVEL_HOST", "LEVEL_SERVICE", "RECENT_S", "SLOW", "TPOT",
           "TPOT_BEFORE", "candidates", "instance_breaches"]
