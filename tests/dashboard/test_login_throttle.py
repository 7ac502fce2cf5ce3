"""Repeated wrong passwords slow the login down, for a new session too."""

from __future__ import annotations

import pytest

from fleetlens.dashboard.throttle import Throttle
from tests.dashboard.conftest import APP


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_waits_double_after_the_free_tries_and_a_success_clears_them() -> None:
    clock = FakeClock()
    record = Throttle(free=3, base_s=2.0, cap_s=10.0, clock=clock)
    assert [record.failed("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert record.failed("a") == 2.0 and record.wait_s("a") == 2.0
    assert record.wait_s("b") == 0.0  # another client is not slowed
    clock.now += 2.0
    assert record.wait_s("a") == 0.0
    assert [record.failed("a") for _ in range(3)] == [4.0, 8.0, 10.0]  # capped
    record.succeeded("a")
    assert record.wait_s("a") == 0.0 and record.failed("a") == 0.0


@pytest.fixture
def login_app(demo_data, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from fleetlens.dashboard import auth, data

    monkeypatch.setenv("FLEETLENS_DATA", str(demo_data[0].root))
    monkeypatch.delenv("FLEETLENS_CONFIG", raising=False)
    monkeypatch.setenv("FLEETLENS_DASHBOARD__AUTH", "password")
    monkeypatch.setenv("FLEETLENS_DASHBOARD_PASSWORD", "hunter2")
    data.config.clear()
    auth.throttle.clear()
    clock = FakeClock()
    auth.throttle().clock = clock
    try:
        yield (lambda: AppTest.from_file(str(APP), default_timeout=60)), clock
    finally:
        data.config.clear()
        auth.throttle.clear()


def _try(at, password: str) -> str:  # noqa: ANN001 - an AppTest
    at.text_input(key="password").input(password)
    at.button[0].click().run()
    assert not at.exception, [e.value for e in at.exception]
    return " ".join(e.value for e in at.error)


def test_repeated_failed_logins_slow_down(login_app) -> None:
    new_session, clock = login_app
    at = new_session()
    at.run()
    for _ in range(3):
        assert _try(at, "guess") == "Wrong password."
    assert _try(at, "guess") == "Wrong password. Next try in 2 s."
    # While the wait lasts even the right password is not checked, in any session.
    assert "Too many failed logins" in _try(at, "hunter2")
    other = new_session()
    other.run()
    assert "Too many failed logins" in _try(other, "hunter2")
    assert not other.metric
    clock.now += 2.5
    assert _try(other, "hunter2") == ""
    assert any(m.label == "Requests/s" for m in other.metric)
