"""No blind warm-up (issue 30 item 2): a fleet analysed from its first minutes finds an
incident in its 6th minute, and a clean fresh fleet raises nothing while it warms up."""

from __future__ import annotations

import dataclasses

import polars as pl
import pytest

from fleetlens.analytics.analyse import analyse
from fleetlens.analytics.attribution import Tables
from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.pipeline.schema import columns as c
from tests.analytics.synthetic import FleetSpec, Injected, generate

MIN = 60
SURGE = Injected("traffic_surge", "service_name=chat", 6 * MIN, 5 * MIN, magnitude=1.0)


def _tables(data) -> Tables:  # noqa: ANN001 - a SynthData
    return Tables.from_frames(data.requests, data.engine_samples, data.gpu_samples,
                              data.windows, data.instance_gpus)


@pytest.fixture(scope="module")
def fresh_surge() -> Tables:
    """A fleet whose data starts 6 minutes before a surge (a fresh install)."""
    return _tables(generate(FleetSpec(duration_s=30 * MIN, seed=21), [SURGE]))


def _found(incidents: pl.DataFrame) -> pl.DataFrame:
    start, end = (SURGE.start_s * 1e9, (SURGE.start_s + SURGE.duration_s) * 1e9)
    t0 = FleetSpec().start_ns
    return incidents.filter((pl.col(c.START_NS) < t0 + end) & (pl.col(c.END_NS) > t0 + start))


def test_a_surge_in_the_sixth_minute_is_found_and_named(fresh_surge: Tables) -> None:
    result = analyse(fresh_surge, AnalyticsConfig())
    hits = _found(result.incidents)
    assert hits.height >= 1, result.incidents
    first = hits.sort(c.START_NS).row(0, named=True)
    assert first[c.DETECTED_NS] - FleetSpec().start_ns <= (SURGE.start_s + 5 * MIN) * 1e9
    top = result.causes.filter((pl.col(c.INCIDENT_ID) == first[c.INCIDENT_ID])
                               & (pl.col(c.RANK) == 1)).row(0, named=True)
    assert top[c.CAUSE] == "traffic_surge", result.causes


def test_without_the_warmup_the_same_surge_is_missed(fresh_surge: Tables) -> None:
    """The code before: no band before 20 windows, so the first 20 minutes were blind."""
    blind = dataclasses.replace(AnalyticsConfig(), warmup_min_windows=None)
    assert _found(analyse(fresh_surge, blind).incidents).is_empty()


def test_a_clean_fresh_fleet_raises_nothing_while_it_warms_up() -> None:
    for seed in (22, 23):
        clean = _tables(generate(FleetSpec(duration_s=30 * MIN, seed=seed)))
        result = analyse(clean, AnalyticsConfig())
        assert result.incidents.is_empty(), result.incidents
