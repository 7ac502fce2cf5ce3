"""A strong breach is reported from its first window (issue 30 item 6: live, each of the
``consecutive`` windows waited for is its length in delay)."""

from __future__ import annotations

import dataclasses

import polars as pl
import pytest

from fleetlens.analytics.analyse import analyse
from fleetlens.analytics.attribution import Tables
from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.detect import DETECTOR_STRONG, explain_detector
from fleetlens.pipeline.schema import columns as c
from tests.analytics.synthetic import FleetSpec, Injected, generate

MIN = 60
NS = 1_000_000_000
SURGE = Injected("traffic_surge", "service_name=chat", 35 * MIN, 6 * MIN, magnitude=1.0)
STRONG = dataclasses.replace(AnalyticsConfig(), strong_ratio=2.0)


def _tables(spec: FleetSpec, incidents: list[Injected]) -> Tables:
    data = generate(spec, incidents)
    return Tables.from_frames(data.requests, data.engine_samples, data.gpu_samples,
                              data.windows, data.instance_gpus)


def _surge(incidents: pl.DataFrame, spec: FleetSpec) -> dict:
    start = spec.start_ns + SURGE.start_s * NS
    hits = incidents.filter((pl.col(c.START_NS) < start + SURGE.duration_s * NS)
                            & (pl.col(c.END_NS) > start)).sort(c.DETECTED_NS)
    assert hits.height >= 1, incidents
    return hits.row(0, named=True)


@pytest.fixture(scope="module")
def surge() -> tuple[Tables, FleetSpec]:
    spec = FleetSpec(duration_s=50 * MIN, seed=41)
    return _tables(spec, [SURGE]), spec


def test_a_strong_breach_is_detected_at_its_first_window(surge) -> None:
    tables, spec = surge
    result = analyse(tables, STRONG)
    first = _surge(result.incidents, spec)
    window = 60 * NS
    assert first[c.DETECTED_NS] - first[c.START_NS] == window
    assert DETECTOR_STRONG in first[c.DETECTOR].split(",")
    top = result.causes.filter((pl.col(c.INCIDENT_ID) == first[c.INCIDENT_ID])
                               & (pl.col(c.RANK) == 1)).row(0, named=True)
    assert top[c.CAUSE] == "traffic_surge"
    assert "upper band in a window" in explain_detector(first[c.DETECTOR], STRONG)


def test_without_the_strong_rule_it_waits_for_three_windows(surge) -> None:
    tables, spec = surge
    first = _surge(analyse(tables, AnalyticsConfig()).incidents, spec)
    assert first[c.DETECTED_NS] - first[c.START_NS] == 3 * 60 * NS


@pytest.mark.parametrize("seed", [42, 43])
def test_a_clean_fleet_raises_nothing_with_the_strong_rule(seed: int) -> None:
    spec = FleetSpec(duration_s=50 * MIN, seed=seed)
    assert analyse(_tables(spec, []), STRONG).incidents.is_empty()


def test_strong_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="strong_ratio"):
        dataclasses.replace(AnalyticsConfig(), strong_ratio=0.5).validate()
    with pytest.raises(ValueError, match="strong_min_rise"):
        dataclasses.replace(AnalyticsConfig(), strong_min_rise=0.9).validate()
