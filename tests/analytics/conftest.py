"""Fixtures for analytics tests: hand-made frames and the synthetic fleet."""

from __future__ import annotations

import pytest

from fleetlens.analytics.config import AnalyticsConfig

NS = 1_000_000_000
T0 = 1_767_225_600 * NS


@pytest.fixture
def config() -> AnalyticsConfig:
    return AnalyticsConfig()
