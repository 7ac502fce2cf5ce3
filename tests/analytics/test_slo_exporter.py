"""The exporter's SLO series, scraped as Prometheus scrapes them: the error budget left and
the burn rate per window equal the stored tables, and the event counters count the windows
that closed since the exporter started."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.exporter import DerivedSignals
from fleetlens.analytics.runner import run
from fleetlens.pipeline.schema.settings import load_section
from fleetlens.pipeline.storage import DataDir
from tests.analytics.slo_data import config_file, write_requests
from tests.analytics.slo_frames import PER_MIN, requests, spread

END = 8 * 60


def scrape(registry: CollectorRegistry) -> dict[tuple, float]:
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_budget_burn_rates_and_event_counters(tmp_path: Path) -> None:
    root = DataDir(tmp_path / "data")
    config = load_section(AnalyticsConfig, "analytics", config_file(tmp_path), environ={})
    write_requests(root, requests(END, spread(END - 70, END, 2)))
    run(root, config, notify=False)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DerivedSignals(root, refresh_s=0))
    got = scrape(registry)
    svc = (("service", "svc"), ("slo", "availability"))
    assert got[("fleetlens_slo_error_budget_remaining_ratio", svc)] == 0.0
    assert got[("fleetlens_slo_error_budget_remaining_ratio",
                (("service", "svc"), ("slo", "ttft_1s")))] == 1.0
    assert got[("fleetlens_slo_objective_ratio", svc)] == 0.999
    assert got[("fleetlens_slo_burn_rate", (*svc, ("window", "1h")))] == pytest.approx(20.0)
    assert got[("fleetlens_slo_burn_rate", (*svc, ("window", "6h")))] == pytest.approx(
        140 / (6 * 60 * PER_MIN) / 0.001)
    assert got[("fleetlens_slo_alert_firing", (("alert", "page_1h_5m"), ("service", "svc"),
                                                ("severity", "page"), ("slo", "availability")))
               ] == 1
    # counters start at 0 when the exporter starts (what was before is not a rate)
    assert got[("fleetlens_slo_events_total", svc)] == 0
    assert got[("fleetlens_slo_bad_events_total", svc)] == 0
    # 10 more minutes, 3 failing in each: the 10 windows that closed since are counted
    # (the last of the first run's windows, full then, is among them; the newest is not)
    write_requests(root, requests(END + 10, spread(END, END + 10, 3))[END * PER_MIN:],
                   name="later.parquet")
    run(root, config, notify=False)
    got = scrape(registry)
    assert got[("fleetlens_slo_events_total", svc)] == 10 * PER_MIN
    assert got[("fleetlens_slo_bad_events_total", svc)] == 2 + 9 * 3
    assert ("fleetlens_slo_alert_firing", (("alert", "page_1h_5m"), ("service", "svc"),
                                           ("severity", "page"), ("slo", "availability"))
            ) in got


def test_no_slos_no_series(tmp_path: Path) -> None:
    root = DataDir(tmp_path / "data")
    write_requests(root, requests(60))
    run(root, AnalyticsConfig(), notify=False)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DerivedSignals(root, refresh_s=0))
    assert not [k for k in scrape(registry) if k[0].startswith("fleetlens_slo_")]
