"""Detection (issue 15): a bursty service's usual highs set a floor under its band, but a
rise that comes with twice the usual arrivals is a surge and is judged by the spread alone
(random fleets 12002, 12010, 12011: injected surges x2-3 moving latency x1.3-1.4 on
replayed-trace services were under the floor and missed)."""

from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl

from fleetlens.analytics.analyse import detect_unpoisoned
from fleetlens.analytics.baselines import to_baselines_table
from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.pipeline.schema import columns as c

from .conftest import NS, T0

STEP = 60 * NS
SURGE = range(150, 160)


def _series(metric: str, values: list[float]) -> pl.DataFrame:
    n = len(values)
    return pl.DataFrame({
        c.SERIES: [f"{metric}{{service_name=chat,model=m,host_name=h01}}"] * n,
        c.METRIC: [metric] * n,
        c.SERVICE_NAME: ["chat"] * n, c.MODEL: ["m"] * n, c.HOST_NAME: ["h01"] * n,
        c.LEVEL: ["host"] * n, c.TS_NS: [T0 + i * STEP for i in range(n)],
        c.VALUE: values, c.REQUESTS: [100] * n,
    })


def _bursty_service(arrivals_during_surge: float) -> pl.DataFrame:
    """TTFT p99 with a 3-window burst x2 every 15 windows (its look-back's 0.9 quantile is
    a burst), and a 10-window rise x1.5 while arrivals go x ``arrivals_during_surge``."""
    rng = np.random.default_rng(7)
    ttft = 0.2 * (1 + rng.normal(0, 0.02, 200))
    rps = 10 * (1 + rng.normal(0, 0.02, 200))
    for start in range(5, 200, 15):
        ttft[start:start + 3] *= 2.0
    ttft[SURGE.start:SURGE.stop] = 0.3 * (1 + rng.normal(0, 0.02, len(SURGE)))
    rps[SURGE.start:SURGE.stop] *= arrivals_during_surge
    return pl.concat([_series("ttft_p99_s", list(ttft)), _series("rps", list(rps))])


def _found(series: pl.DataFrame, config: AnalyticsConfig) -> list[int]:
    _, anomalies = detect_unpoisoned(series, config, 60)
    return sorted(int(x) for x in (anomalies[c.START_NS] - T0) // STEP)


def test_a_rise_under_the_usual_highs_with_twice_the_arrivals_is_found() -> None:
    # Before (no demand rule): the rise x1.5 sat under the bursts' 0.9 quantile x1.15.
    config = AnalyticsConfig()
    assert SURGE.start in _found(_bursty_service(2.2), config)
    assert SURGE.start not in _found(_bursty_service(2.2),
                                     dataclasses.replace(config, demand_ratio=None))


def test_the_same_rise_without_more_arrivals_stays_under_the_floor() -> None:
    # The service's own bursts and a rise as high as they reach are not incidents.
    assert _found(_bursty_service(1.0), AnalyticsConfig()) == []


def test_the_baselines_table_draws_the_band_the_surge_crossed() -> None:
    # Before: the demand band judged the surge, but the `baselines` table (the dashboard's
    # band) kept the floored one, so the breach was drawn under its own band.
    banded, anomalies = detect_unpoisoned(_bursty_service(2.2), AnalyticsConfig(), 60)
    table = to_baselines_table(banded)
    start = T0 + SURGE.start * STEP
    assert start in anomalies[c.START_NS].to_list()
    row = table.filter((pl.col(c.METRIC) == "ttft_p99_s") & (pl.col(c.TS_NS) == start))
    assert row.height == 1
    assert row[c.VALUE][0] > row[c.UPPER][0]
