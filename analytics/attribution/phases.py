"""Attribution step (a): split the excess latency over baseline into phases.

For the incident's requests (its host only, for a host incident) against the baseline
period's requests of the same scope: the mean excess of queue, prefill and overhead time,
and of decode time *per output token* times the incident's output tokens (so a shift to
longer answers is not mistaken for slower decoding). The shares of the positive excesses
sum to 1.

Overhead is what the client waits for outside the engine's phases: the engine's own
``overhead_s`` plus, for requests that came through a gateway, ``network_s``. The two parts
are kept apart in ``excess_s`` as ``engine_overhead`` and ``network`` (not phases).
"""

from __future__ import annotations

from dataclasses import dataclass

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

    def dominant(self) -> str:
        """The phase with the largest share."""
        return max(self.share, key=self.share.__getitem__)


def _means(frame: pl.DataFrame) -> dict[str, float]:
    if frame.is_empty():
        return {"queue": 0.0, "prefill": 0.0, "tpot": 0.0, "overhead": 0.0, "tokens": 0.0,
                "e2e": 0.0, "network": 0.0}
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
    excess.update({"engine_overhead": engine, "network": network})
    return PhaseSplit(excess, share, total, incident.height, baseline.height,
                      (base["e2e"], inc["e2e"]))
