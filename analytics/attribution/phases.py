"""Attribution step (a): split the excess latency over baseline into phases.

For the incident's requests (its host only, for a host incident) against the baseline
period's requests of the same scope: the mean excess of queue, prefill and overhead time,
and of decode time *per output token* times the incident's output tokens (so a shift to
longer answers is not mistaken for slower decoding). The shares of the positive excesses
sum to 1.

Overhead is what the client waits for outside the engine's phases: the engine's own
``overhead_s`` plus, for requests that came through a gateway, ``network_s``. The two parts
are kept apart in ``excess_s`` as ``engine_overhead`` and ``network`` (not phases).

Prefill is split the same way into *volume* and *rate* (``prefill_volume``,
``prefill_rate`` in ``excess_s`` and ``parts``): mean prefill time is exactly (prefill
seconds per uncached prompt token) x (uncached tokens per request), so its excess is
``r_base x (u_inc - u_base)`` (more tokens to prefill: longer prompts, lost prefix reuse)
plus ``u_inc x (r_inc - r_base)`` (each token slower: a slower, throttled or shared GPU).
Causes claim the part their mechanism produces, not the whole phase.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from fleetlens.pipeline.schema import columns as c

PHASES = ("queue", "prefill", "decode", "overhead")


@dataclass(frozen=True)
class PhaseSplit:
    """Per-phase excess (seconds per request) and shares of the total positive excess."""

    excess_s: dict[str, float]
    share: dict[str, float]
    total_excess_s: float
    incident_requests: int
    baseline_requests: int
    e2e_mean_s: tuple[float, float]  # (baseline, incident)
    #: Shares of the total positive excess of sub-phases (``prefill_volume``,
    #: ``prefill_rate``); they sum to the ``prefill`` share.
    parts: dict[str, float] = field(default_factory=dict)

    def dominant(self) -> str:
        """The phase with the largest share."""
        return max(PHASES, key=lambda p: self.share.get(p, 0.0))


def _means(frame: pl.DataFrame) -> dict[str, float]:
    if frame.is_empty():
        return {"queue": 0.0, "prefill": 0.0, "tpot": 0.0, "overhead": 0.0, "tokens": 0.0,
                "e2e": 0.0, "network": 0.0, "uncached": 0.0, "prefill_rate": 0.0}
    uncached = (pl.col(c.INPUT_TOKENS) - pl.col(c.CACHED_TOKENS).fill_null(0)).clip(
        lower_bound=0)
    network = (pl.col(c.NETWORK_S).fill_null(0).clip(lower_bound=0).mean()
               if c.NETWORK_S in frame.columns else pl.lit(0.0))
    row = frame.select(
        network.alias("network"),
        pl.col(c.QUEUE_S).fill_null(0).mean().alias("queue"),
        pl.col(c.PREFILL_S).fill_null(0).mean().alias("prefill"),
        (pl.col(c.DECODE_S).fill_null(0).sum()
         / (pl.col(c.OUTPUT_TOKENS) - 1).clip(lower_bound=0).sum().clip(lower_bound=1))
        .alias("tpot"),
        pl.col(c.OVERHEAD_S).fill_null(0).mean().alias("overhead"),
        (pl.col(c.OUTPUT_TOKENS) - 1).clip(lower_bound=0).mean().alias("tokens"),
        pl.col(c.E2E_S).mean().alias("e2e"),
        uncached.mean().alias("uncached"),
        (pl.col(c.PREFILL_S).fill_null(0).sum() / uncached.sum().clip(lower_bound=1))
        .alias("prefill_rate"),
    ).row(0, named=True)
    return {k: float(v or 0.0) for k, v in row.items()}


def phase_split(incident: pl.DataFrame, baseline: pl.DataFrame) -> PhaseSplit:
    """Split the mean excess of ``incident`` requests over ``baseline`` requests by phase.

    Args:
        incident: `requests` rows of the incident's scope and period.
        baseline: `requests` rows of the same scope in the baseline period.
    """
    inc, base = _means(incident), _means(baseline)
    engine = inc["overhead"] - base["overhead"]
    network = inc["network"] - base["network"]
    excess = {
        "queue": inc["queue"] - base["queue"],
        "prefill": inc["prefill"] - base["prefill"],
        "decode": (inc["tpot"] - base["tpot"]) * inc["tokens"],
        "overhead": engine + network,
    }
    positive = {k: max(v, 0.0) for k in PHASES for v in (excess[k],)}
    total = sum(positive.values())
    share = {k: (v / total if total > 0 else 0.0) for k, v in positive.items()}
    volume = base["prefill_rate"] * (inc["uncached"] - base["uncached"])
    rate = inc["uncached"] * (inc["prefill_rate"] - base["prefill_rate"])
    excess.update({"engine_overhead": engine, "network": network,
                   "prefill_volume": volume, "prefill_rate": rate})
    return PhaseSplit(excess, share, total, incident.height, baseline.height,
                      (base["e2e"], inc["e2e"]), _prefill_parts(volume, rate, share["prefill"]))


def _prefill_parts(volume: float, rate: float, prefill_share: float) -> dict[str, float]:
    """The prefill share divided between volume and rate by their positive excesses (a part
    that went down explains none of the excess)."""
    pos = {"prefill_volume": max(volume, 0.0), "prefill_rate": max(rate, 0.0)}
    total = sum(pos.values())
    return {k: (prefill_share * v / total if total > 0 else 0.0) for k, v in pos.items()}
