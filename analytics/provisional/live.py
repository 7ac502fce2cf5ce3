"""The live pass: which queues the engines' gauges show now, each with its likely cause."""


from __future__ import annotations

import polars as pl

from fleetlens.analytics.provisional.config import ProvisionalConfig
from fleetlens.analytics.provisional.gauges import Candidate, candidates
from fleetlens.analytics.provisional.guess import Guess, guess
from fleetlens.pipeline.normalize import SOURCE_GATEWAY
from fleetlens.pipeline.schema import columns as c

NS = 1_000_000_000
#: How far back an instance's requests say which service it serves, s.
_SERVICE_LOOKBACK_S = 1800


def _services(requests: pl.LazyFrame, since_ns: int) -> dict[str, str]:
    """The service each instance served most in the last half hour (engine spans only: a
    gateway's failed span names the engine it was routed to, not one that served)."""
    rows = (requests.filter((pl.col(c.ARRIVAL_NS) >= since_ns)
                            & (pl.col(c.SOURCE) != SOURCE_GATEWAY))
            .group_by(c.INSTANCE_ID, c.SERVICE_NAME).agg(pl.len().alias("_n"))
            .sort(c.INSTANCE_ID, "_n", c.SERVICE_NAME, descending=[False, True, False])
            .group_by(c.INSTANCE_ID, maintain_order=True).first().collect())
    return dict(zip(rows[c.INSTANCE_ID].to_list(), rows[c.SERVICE_NAME].to_list(), strict=True))


def queues(engine: pl.LazyFrame, requests: pl.LazyFrame, cfg: ProvisionalConfig,
           host_share: float, shared_start_s: float, near_ns: int | None = None
           ) -> list[tuple[Candidate, Guess]]:
    """The queues the engines' gauges show now, each with its likely cause.

    ``near_ns`` (the analysed windows' end, when known): only samples from half an hour
    before it are read for the newest one, not the whole history (a follow loop runs this
    every few seconds over up to two days of 1 s samples).
    """
    if near_ns is not None:
        engine = engine.filter(pl.col(c.TS_NS) >= near_ns - _SERVICE_LOOKBACK_S * NS)
    newest = engine.select(pl.col(c.TS_NS).max()).collect().item()
    if newest is None:
        return []
    services = _services(requests, int(newest) - _SERVICE_LOOKBACK_S * NS)
    found, frame = candidates(engine, services, int(newest), cfg, host_share, shared_start_s)
    return [(cand, guess(cand, frame, cfg)) for cand in found]


__all__ = ["queues"]
