"""Headroom against the Prophet demand forecast: a service whose arrivals follow a daily
cycle, a pool whose knee lies under tomorrow's peak: when the forecast crosses it, and how
many GPUs the peak needs."""

from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl
import pytest

from fleetlens.analytics.capacity.forecast import forecast_crossing, with_forecast
from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.pipeline.schema import FLEET_WIDE, conform
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

NS = 1_000_000_000
T0 = 1_767_225_600 * NS
DAY = 86400
PEAK_HOUR = 14


def _windows(days: float = 3.0) -> pl.DataFrame:
    """Fleet-wide `windows` rows of service chat: 20 req/s +- 10 with the peak at 14:00 UTC."""
    ts = np.arange(0, int(days * DAY), 60) * NS + T0
    hours = (ts - T0) / NS / 3600
    rps = 20 + 10 * np.cos(2 * np.pi * (hours - PEAK_HOUR) / 24)
    rps += np.random.default_rng(0).normal(0, 0.3, len(ts))
    return conform(pl.DataFrame({c.WINDOW_START_NS: ts, c.WINDOW_S: 60,
                                 c.SERVICE_NAME: "chat", c.MODEL: "m",
                                 c.HOST_NAME: FLEET_WIDE, c.RPS: rps}), t.WINDOWS)


def _capacity(end_ns: int, knee_rps: float) -> pl.DataFrame:
    """One pool (2 instances of TP 2) taking all of chat's arrivals."""
    return conform(pl.DataFrame({c.TS_NS: [end_ns], c.SERVICE_NAME: ["chat"], c.MODEL: ["m"],
                                 c.GPU_MODEL: ["H100"], c.TP: [2], c.CONFIG: ["-"],
                                 c.KNEE_RPS: [knee_rps], c.RPS_NOW: [15.0],
                                 c.INSTANCES: [2]}), t.CAPACITY)


@pytest.mark.slow
def test_the_forecast_peak_crosses_the_knee_at_the_next_peak_and_names_the_gpus() -> None:
    windows = _windows()
    end = int(windows[c.WINDOW_START_NS].max()) + 60 * NS  # 00:00 UTC on day 4
    config = dataclasses.replace(AnalyticsConfig(), prophet=True, prophet_workers=1)
    out = with_forecast(_capacity(end, knee_rps=25.0), windows.lazy(), config).row(
        0, named=True)
    assert out[c.FORECAST_PEAK_RPS] == pytest.approx(30.0, rel=0.05)
    peak_hour = (out[c.FORECAST_PEAK_NS] - T0) / NS / 3600 % 24
    assert abs(peak_hour - PEAK_HOUR) <= 0.5
    # 25 req/s is crossed on the way up to the 14:00 peak: cos(x) = 0.5, 4 h before it
    crossing_hour = (out[c.CROSSING_NS] - T0) / NS / 3600 % 24
    assert abs(crossing_hour - (PEAK_HOUR - 4)) <= 0.5
    # 30 req/s at 12.5 req/s per instance: 3 instances, one more of 2 GPUs
    assert out[c.GPUS_NEEDED] == 2


def test_a_knee_above_the_forecast_peak_is_never_crossed() -> None:
    end = T0 + 3 * DAY * NS
    grid = np.arange(end, end + DAY * NS, 300 * NS)
    forecast = pl.DataFrame({c.SERIES: "rps{service_name=chat,model=m}", c.TS_NS: grid,
                             c.EXPECTED: 20 + 10 * np.sin(np.arange(len(grid)) / 40)})
    out = forecast_crossing(_capacity(end, knee_rps=40.0), forecast).row(0, named=True)
    assert out[c.FORECAST_PEAK_RPS] == pytest.approx(30.0, rel=0.01)
    assert out[c.CROSSING_NS] is None and out[c.GPUS_NEEDED] == 0


def test_without_prophet_the_forecast_columns_stay_empty() -> None:
    out = with_forecast(_capacity(T0, 25.0), _windows(0.1).lazy(), AnalyticsConfig())
    assert out.select(c.FORECAST_PEAK_RPS, c.CROSSING_NS, c.GPUS_NEEDED).row(0) == (
        None, None, None)
    assert out.columns == list(t.table(t.CAPACITY).columns)


def test_a_pool_with_no_rate_now_gets_no_share_of_the_forecast() -> None:
    # An insufficient pool (no rate measured now) beside one that has it: the run crashed
    # with a TypeError (None / float) before the share was guarded.
    end = T0 + 3 * DAY * NS
    grid = np.arange(end, end + DAY * NS, 300 * NS)
    forecast = pl.DataFrame({c.SERIES: "rps{service_name=chat,model=m}", c.TS_NS: grid,
                             c.EXPECTED: np.full(len(grid), 30.0)})
    pools = pl.concat([_capacity(end, knee_rps=25.0),
                       _capacity(end, knee_rps=25.0).with_columns(
                           pl.lit(None, pl.Float64).alias(c.RPS_NOW),
                           pl.lit("other").alias(c.CONFIG))])
    measured, idle = forecast_crossing(pools, forecast).iter_rows(named=True)
    assert measured[c.FORECAST_PEAK_RPS] == pytest.approx(30.0)
    assert idle[c.FORECAST_PEAK_RPS] is None and idle[c.CROSSING_NS] is None
