"""`requests` frames with known error ratios per minute, for the SLO tests."""

from __future__ import annotations

import numpy as np
import polars as pl

from fleetlens.pipeline.schema import columns as c

NS = 1_000_000_000
MIN = 60 * NS
#: 2026-01-01T00:00:00Z, a window edge
T0 = 1_767_225_600 * NS
PER_MIN = 100


def requests(minutes: int, bad_per_min: dict[int, int] | None = None, *,
             service: str = "svc", ttft_s: float = 0.2, slow_per_min: dict[int, int] | None
             = None) -> pl.DataFrame:
    """``PER_MIN`` requests in each of ``minutes`` minutes from :data:`T0`; in minute ``m``,
    ``bad_per_min[m]`` of them failed and ``slow_per_min[m]`` (of the others) had a TTFT of
    2 s instead of ``ttft_s``."""
    bad_per_min = bad_per_min or {}
    slow_per_min = slow_per_min or {}
    minute = np.repeat(np.arange(minutes), PER_MIN)
    slot = np.tile(np.arange(PER_MIN), minutes)
    bad = slot < np.array([bad_per_min.get(m, 0) for m in range(minutes)])[minute]
    slow_n = np.array([slow_per_min.get(m, 0) for m in range(minutes)])[minute]
    slow = ~bad & (slot >= PER_MIN - slow_n)
    return pl.DataFrame({
        c.SERVICE_NAME: [service] * len(minute),
        c.ARRIVAL_NS: T0 + minute * MIN + slot * (MIN // PER_MIN),
        c.IS_ERROR: bad,
        c.TTFT_S: np.where(bad, np.nan, np.where(slow, 2.0, ttft_s)),
        c.E2E_S: np.where(bad, 0.1, 1.0),
        c.TPOT_S: np.full(len(minute), 0.02),
        c.QUEUE_S: np.full(len(minute), 0.01),
    }).with_columns(pl.col(c.TTFT_S).fill_nan(None))


def spread(start: int, end: int, count: int) -> dict[int, int]:
    """``count`` bad requests in each minute of [start, end)."""
    return dict.fromkeys(range(start, end), count)
