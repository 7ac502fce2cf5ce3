"""Burn rates, multiwindow alerts and error budgets on `requests` built with known error
ratios: an alert fires exactly when both of its windows burn at its factor or faster."""

from __future__ import annotations

import polars as pl
import pytest

from fleetlens.analytics.slos.config import BurnRateAlert, LatencySlo, ServiceSlos, SloConfig
from fleetlens.analytics.slos.report import alert_rows, slo_report
from fleetlens.pipeline.schema import columns as c
from tests.analytics.slo_frames import MIN, PER_MIN, T0, requests, spread

HOURS = 8
END = HOURS * 60  # minutes of data; "now" is the end of the last
NOW = T0 + END * MIN
CONFIG = SloConfig(services=(ServiceSlos("svc", availability=0.999),), period_days=1)


def report(frame: pl.DataFrame, config: SloConfig = CONFIG):  # noqa: ANN201
    return slo_report(frame.lazy(), config, 60)


def firing(frame: pl.DataFrame, config: SloConfig = CONFIG) -> set[str]:
    return set(report(frame, config).alerts[c.ALERT])


def burn(frame: pl.DataFrame, window_s: int, slo: str = "availability") -> float:
    rates = report(frame).burn_rates
    return rates.filter((pl.col(c.WINDOW_S) == window_s) & (pl.col(c.SLO) == slo))[
        c.BURN_RATE].item()


def test_burn_rate_is_the_error_ratio_over_the_budget() -> None:
    frame = requests(END, spread(END - 60, END, 2))  # 2% failing for the last hour
    assert report(frame).now_ns == NOW
    assert burn(frame, 300) == pytest.approx(20.0)
    assert burn(frame, 3600) == pytest.approx(20.0)
    assert burn(frame, 6 * 3600) == pytest.approx(20.0 / 6)


def test_the_fast_page_fires_when_both_windows_burn_above_14_4() -> None:
    onset = END - 70  # 2% (20x) for the last 70 minutes
    got = report(requests(END, spread(onset, END, 2)))
    # the 6 h burn is 3.9x: the slow page is quiet; over the 8 h of data (3 days asked) the
    # ticket's burn is 2.9x, and 3.9x over 6 h: a ticket too
    assert set(got.alerts[c.ALERT]) == {"page_1h_5m", "ticket_3d_6h"}
    alert = got.alerts.filter(pl.col(c.ALERT) == "page_1h_5m").row(0, named=True)
    assert alert[c.SEVERITY] == "page"
    assert alert[c.LONG_BURN_RATE] == pytest.approx(20.0)
    # the 1 h burn reaches 14.4 after 44 minutes of 20x (43.2 is not a window edge)
    assert alert[c.SINCE_NS] == T0 + (onset + 44) * MIN


def test_a_short_spike_alone_does_not_page() -> None:
    frame = requests(END, spread(END - 5, END, 10))  # 100x for 5 min: 1 h burn 8.3x
    assert burn(frame, 300) == pytest.approx(100.0) and burn(frame, 3600) < 14.4
    assert "page_1h_5m" not in firing(frame)


def test_a_burn_that_stopped_does_not_page() -> None:
    frame = requests(END, spread(END - 60, END - 10, 2))  # 1 h burn 16.7x, last 10 min clean
    assert burn(frame, 3600) >= 14.4 and burn(frame, 300) == 0
    assert "page_1h_5m" not in firing(frame)


def test_the_slow_page_needs_both_its_windows_at_6x() -> None:
    # 10x for 6 hours: 6 h and 30 min burn 10x (the fast page's 1 h, 10x, is under 14.4)
    assert firing(requests(END, spread(END - 6 * 60, END, 1))) == {"page_6h_30m",
                                                                    "ticket_3d_6h"}
    # 10x for 3 hours: 30 min at 10x, but 6 h at 5x: no slow page
    assert firing(requests(END, spread(END - 3 * 60, END, 1))) == {"ticket_3d_6h"}


def test_each_rule_fires_on_its_own_windows() -> None:
    rule = BurnRateAlert("ticket", 6.0, 4 * 3600, 3600)
    config = SloConfig(services=CONFIG.services, period_days=1, alerts=(rule,))
    # 10x for the last 2 hours: the 4 h burn is 5x, under 6: no ticket
    assert firing(requests(END, spread(END - 120, END, 1)), config) == set()
    # 10x for the last 3 hours: 4 h burn 7.5x and 1 h burn 10x: a ticket
    assert firing(requests(END, spread(END - 180, END, 1)), config) == {"ticket_4h_1h"}


def test_the_error_budget_over_the_period() -> None:
    bad = {10: 3, 200: 4, 400: 3}  # 10 failures in 48,000 requests; 48 allowed at 99.9%
    status = report(requests(END, bad)).status.row(0, named=True)
    total = END * PER_MIN
    assert status[c.TOTAL_EVENTS] == total and status[c.BAD_EVENTS] == 10
    assert status[c.ALLOWED_BAD_EVENTS] == pytest.approx(0.001 * total)
    assert status[c.BUDGET_REMAINING] == pytest.approx(1 - 10 / 48)
    assert status[c.COMPLIANCE] == pytest.approx(1 - 10 / total)
    overspent = report(requests(END, spread(0, 60, 1))).status.row(0, named=True)
    assert overspent[c.BUDGET_CONSUMED] == pytest.approx(60 / 48)
    assert overspent[c.BUDGET_REMAINING] == 0.0


def test_the_period_bounds_the_budget() -> None:
    # failures more than a day before now are outside a 1-day compliance period
    frame = requests(26 * 60, spread(0, 60, 5))
    status = report(frame).status.row(0, named=True)
    assert status[c.BAD_EVENTS] == 0 and status[c.TOTAL_EVENTS] == 24 * 60 * PER_MIN


def test_latency_slo_counts_slow_successful_requests_only() -> None:
    config = SloConfig(services=(ServiceSlos("svc", latency=(
        LatencySlo("ttft", 1.0, 0.99),)),), period_days=1)
    # 20% slow (TTFT 2 s) for the last 70 minutes, and 50% failing then (not latency events)
    frame = requests(END, spread(END - 70, END, 50), slow_per_min=spread(END - 70, END, 10))
    got = report(frame, config)
    assert got.status[c.SLO].to_list() == ["ttft_1s"]
    rates = got.burn_rates.filter(pl.col(c.WINDOW_S) == 3600).row(0, named=True)
    assert rates[c.TOTAL_EVENTS] == 60 * 50 and rates[c.BAD_EVENTS] == 60 * 10
    assert rates[c.BURN_RATE] == pytest.approx(0.2 / 0.01)
    assert set(got.alerts[c.ALERT]) == {"page_1h_5m", "ticket_3d_6h"}  # 6 h: 2.2x


def test_a_service_without_slos_gets_none() -> None:
    frame = pl.concat([requests(END, spread(END - 70, END, 50)),
                       requests(END, service="other")])
    got = report(frame)
    assert set(got.status[c.SERVICE_NAME]) == {"svc"}
    assert report(frame, SloConfig()).status.is_empty()


def test_alert_ids_stay_while_firing_and_rows_carry_the_slo() -> None:
    onset = END - 70
    now = report(requests(END, spread(onset, END, 2)))
    later = report(requests(END + 5, spread(onset, END + 5, 2)))
    assert now.alerts[c.ALERT_ID].to_list() == later.alerts[c.ALERT_ID].to_list()
    row = alert_rows(now)[0]
    assert row[c.INCIDENT_ID] == now.alerts[c.ALERT_ID][0] and row[c.SLO] == "availability"
    assert row[c.START_NS] == now.alerts[c.SINCE_NS][0] and row[c.SEVERITY] == "page"
