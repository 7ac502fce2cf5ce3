"""A provisional incident's likely cause, from the same gauges that opened it.

Only what the gauges show before any slow request has ended, in the causes' vocabulary and
in the order the span-based attribution weighs them (analytics/attribution/rules.py: a cache
that filled under more demand is the demand's doing):

* ``traffic_surge`` (subject the service): the engines computed at least ``surge_ratio`` x
  the prompt tokens per second of their look-back (more work came in; a queue with no more
  work is not a surge);
* ``kv_cache_pressure`` (subject the host, or the service for a service-wide queue): the KV
  cache was at least ``kv_full`` full in most breaching samples;
* ``engine_overhead`` (subject the host or service) when the breach is mostly a slower
  decode with no queue (:mod:`.gauges`, ``decode_ratio``) and no more prompt tokens came
  in: every step got slower with the same work. A slower or throttled GPU shows the same
  on these gauges; the confirmed incident, which sees the GPUs' clocks, corrects it;
* otherwise no cause yet: the engines take requests in faster than they serve them for a
  reason the gauges do not show (a hang not yet 30 s old); the confirmed incident names
  it.

The score is the guess's strength on the attribution's 0..1 scale (a surge x2 or a cache
full in every sample is 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from fleetlens.analytics.provisional.config import ProvisionalConfig
from fleetlens.analytics.provisional.gauges import (
    LEVEL_SERVICE,
    SLOW,
    TPOT,
    TPOT_BEFORE,
    Candidate,
)
from fleetlens.pipeline.schema import Cause
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema.causes import subject

NS = 1_000_000_000
#: Fewest seconds of counter history on each side for a rate (one scrape apart is noise).
_MIN_SPAN_S = 5.0
#: Share of breaching samples with a full cache that names the cache.
_KV_SHARE = 0.5
#: The arrivals rise before the queue shows (a surge fills the batch first: 6-10 s on the
#: bench's L4s), so the rate "now" starts this long before the first breaching sample,
_NOW_BEFORE_S = 10
#: ... and the look-back's rate ends this long before it (clear of the rise).
_BEFORE_GUARD_S = 30


@dataclass
class Guess:
    """The likely cause (``None``: not known yet), its subject, strength and one line."""

    cause: str | None
    subject: str
    score: float
    summary: str
    evidence: dict[str, Any]


def _rate(samples: pl.DataFrame) -> float | None:
    """Prompt tokens per second summed over the instances (a counter that fell, a restart,
    leaves its instance out)."""
    total, any_rate = 0.0, False
    for _, part in samples.group_by(c.INSTANCE_ID):
        part = part.drop_nulls(c.PROMPT_TOKENS_TOTAL).sort(c.TS_NS)
        if part.height < 2:
            continue
        span = (part[c.TS_NS][-1] - part[c.TS_NS][0]) / NS
        grew = part[c.PROMPT_TOKENS_TOTAL][-1] - part[c.PROMPT_TOKENS_TOTAL][0]
        if span >= _MIN_SPAN_S and grew >= 0:
            total += grew / span
            any_rate = True
    return total if any_rate else None


def guess(cand: Candidate, frame: pl.DataFrame, cfg: ProvisionalConfig) -> Guess:
    """The likely cause of ``cand`` from its instances' samples in ``frame``."""
    mine = frame.filter(pl.col(c.INSTANCE_ID).is_in(cand.instances))
    during = mine.filter(pl.col(c.TS_NS).is_between(cand.start_ns, cand.end_ns))
    before = _rate(mine.filter(pl.col(c.TS_NS) < cand.start_ns - _BEFORE_GUARD_S * NS))
    now = _rate(mine.filter(pl.col(c.TS_NS).is_between(cand.start_ns - _NOW_BEFORE_S * NS,
                                                       cand.end_ns)))
    ratio = now / before if before and now is not None else None
    full = float((during[c.KV_CACHE_USAGE].fill_null(0) >= cfg.kv_full).mean() or 0.0)
    kv_max = float(during[c.KV_CACHE_USAGE].max() or 0.0)
    evidence: dict[str, Any] = {
        "waiting_peak": cand.peak_waiting, "waiting_before": cand.expected_waiting,
        "prompt_tok_s_before": before, "prompt_tok_s": now, "prompt_tok_s_ratio": ratio,
        "kv_full_share": full, "kv_max": kv_max, "instances": cand.instances,
        "breach_s": (cand.end_ns - cand.start_ns) / NS}
    slow = float(during[SLOW].mean() or 0.0)
    tpot = during.filter(pl.col(SLOW)).select(pl.col(TPOT).median(),
                                              pl.col(TPOT_BEFORE).median()).row(0)
    evidence.update({"slow_decode_share": slow, "tpot_gauge_s": tpot[0],
                     "tpot_gauge_before_s": tpot[1]})
    where = cand.service if cand.level == LEVEL_SERVICE else f"{cand.service} on {cand.host}"
    scope = (subject(c.SERVICE_NAME, cand.service) if cand.level == LEVEL_SERVICE
             else subject(c.HOST_NAME, cand.host))
    if slow >= _KV_SHARE and tpot[0] and tpot[1] and (ratio is None
                                                      or ratio < cfg.surge_ratio):
        rise = tpot[0] / tpot[1]
        return Guess(Cause.ENGINE_OVERHEAD, scope, min(1.0, (rise - 1.0) / 0.5),
                     f"decode slower on {where} with no queue and no more work: "
                     f"{tpot[1] * 1000:.0f} -> {tpot[0] * 1000:.0f} ms per token "
                     f"(running / tokens per second)", evidence)
    queue = f"{cand.peak_waiting:.0f} requests waiting on {where}"
    if ratio is not None and ratio >= cfg.surge_ratio:
        return Guess(Cause.TRAFFIC_SURGE, subject(c.SERVICE_NAME, cand.service),
                     min(1.0, ratio - 1.0),
                     f"{queue}; prompt tokens x{ratio:.1f} ({before:,.0f} -> {now:,.0f}/s): "
                     f"more work came in", evidence)
    if full >= _KV_SHARE:
        return Guess(Cause.KV_CACHE_PRESSURE, scope, full,
                     f"{queue}; KV cache at least {cfg.kv_full:.0%} full in {full:.0%} of "
                     f"the samples (max {kv_max:.0%}) without more work coming in", evidence)
    return Guess(None, subject(c.SERVICE_NAME, cand.service), 0.0,
                 f"{queue}; no more work came in and the KV cache has room: the engines "
                 "serve more slowly than requests arrive (the confirmed incident will say "
                 "why)", evidence)


__all__ = ["Guess", "guess"]
