"""Sidebar filters and time range travel in the URL; the host list follows the service."""

from __future__ import annotations

import datetime as dt

import pytest

from fleetlens.dashboard import url_state
from tests.dashboard.conftest import APP
from tests.dashboard.synth import SERVICES


@pytest.fixture
def fresh(demo_data, monkeypatch):
    """An AppTest not yet run (so a test can set the URL it opens)."""
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("FLEETLENS_DATA", str(demo_data[0].root))
    monkeypatch.delenv("FLEETLENS_CONFIG", raising=False)
    return AppTest.from_file(str(APP), default_timeout=60)


def _values(value: str | list[str]) -> list[str]:
    return value if isinstance(value, list) else [value]  # AppTest unwraps single values


def test_a_shared_link_opens_its_range_and_scope(fresh) -> None:
    fresh.query_params["range"] = "1h"
    fresh.query_params["service"] = [SERVICES[1]]
    fresh.query_params["host"] = ["gpu-host-02", "no-such-host"]
    fresh.run()
    assert not fresh.exception, [e.value for e in fresh.exception]
    assert fresh.sidebar.selectbox(key="f_range").value == "Last 1 h"
    assert fresh.sidebar.multiselect(key="f_services").value == [SERVICES[1]]
    assert fresh.sidebar.multiselect(key="f_hosts").value == ["gpu-host-02"]  # unknown: dropped


def test_picks_are_written_to_the_url(app) -> None:
    app.sidebar.selectbox(key="f_range").set_value("Last 6 h").run()
    app.sidebar.multiselect(key="f_services").set_value([SERVICES[0]]).run()
    assert not app.exception
    assert _values(app.query_params["range"]) == ["6h"]
    assert _values(app.query_params["service"]) == [SERVICES[0]]
    app.sidebar.multiselect(key="f_services").set_value([]).run()
    assert "service" not in app.query_params


def test_host_list_is_narrowed_by_the_service(app) -> None:
    everything = app.sidebar.multiselect(key="f_hosts").options
    app.sidebar.multiselect(key="f_hosts").set_value(["gpu-host-01"]).run()
    app.sidebar.multiselect(key="f_services").set_value([SERVICES[1]]).run()
    assert not app.exception, [e.value for e in app.exception]
    hosts = app.sidebar.multiselect(key="f_hosts")
    assert set(hosts.options) == {"gpu-host-02", "gpu-host-03"} < set(everything)
    assert hosts.value == []  # gpu-host-01 does not serve that service: its pick is dropped


def test_custom_range_round_trips_through_the_url() -> None:
    start = dt.datetime(2026, 12, 1, 10, 0, tzinfo=dt.UTC)
    end = dt.datetime(2026, 12, 1, 11, 30, tzinfo=dt.UTC)
    params = url_state.encode({"f_range": "Custom", "f_custom": (start, end)})
    assert params == {"range": "custom", "from": "2026-12-01T10:00Z", "to": "2026-12-01T11:30Z"}
    state: dict = {}
    url_state.seed(state, {k: [v] for k, v in params.items()}, {},
                   (start - dt.timedelta(hours=1), end + dt.timedelta(hours=1)))
    assert state == {"f_range": "Custom", "f_custom": (start, end)}
