"""The log signal as evidence for ``collective_stall`` (issue 15).

The engines' NCCL warnings and PyTorch watchdog collective timeouts (``log_events``, parsed
by :mod:`pipeline.logsignal`) say directly that a tensor-parallel group's collectives are in
trouble, which GPU activity only suggests. A host's log strength is 1 when a collective timed
out there during the incident and not in the baseline period, and otherwise grows with the
rise in NCCL warnings per minute over the baseline's rate (:data:`WARNS_PER_MIN_FULL` more
for full strength): a host that always warns is not incriminated by warning.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from fleetlens.analytics.attribution.context import IncidentContext
from fleetlens.pipeline.schema import columns as c

#: extra NCCL warnings per minute over the baseline that count as full evidence
WARNS_PER_MIN_FULL = 2.0


def _counts(events: pl.DataFrame, lo: int, hi: int) -> tuple[int, int]:
    """(NCCL warnings, collective timeouts) in [lo, hi)."""
    got = events.filter(pl.col(c.TS_NS).is_between(lo, hi, closed="left"))
    timeouts = int((got[c.LOG_EVENT] == c.LOG_EVENT_COLLECTIVE_TIMEOUT).sum())
    return got.height - timeouts, timeouts


def collective_log_strength(ctx: IncidentContext, host: str) -> tuple[float, dict[str, Any]]:
    """Strength in [0, 1] of the log evidence for a collective stall on ``host``, and the
    counts behind it (for the cause's evidence)."""
    events = ctx.log_events
    if events is None or events.is_empty():
        return 0.0, {}
    events = events.filter(pl.col(c.HOST_NAME) == host)
    warns, timeouts = _counts(events, ctx.start_ns, ctx.end_ns)
    base_warns, base_timeouts = _counts(events, ctx.base_start_ns, ctx.base_end_ns)
    if not (warns or timeouts):
        return 0.0, {}
    minutes = max(ctx.duration_s / 60, 1 / 60)
    base_minutes = max(ctx.base_duration_s / 60, 1 / 60)
    rise = warns / minutes - base_warns / base_minutes
    strength = max(0.0, min(1.0, rise / WARNS_PER_MIN_FULL))
    if timeouts and timeouts / minutes > base_timeouts / base_minutes:
        strength = 1.0
    return strength, {"nccl_warnings": warns, "collective_timeouts": timeouts,
                      "baseline_nccl_warnings": base_warns,
                      "baseline_collective_timeouts": base_timeouts}
