"""One definition of each thing: one grammar for durations and times (the same text means the
same in `--since`, scenario starts and SLO rules), and one loopback check."""

from __future__ import annotations

import pytest

from fleetlens.analytics.cli import parse_since
from fleetlens.analytics.slo import parse_rule
from fleetlens.pipeline.schema.timegrammar import parse_duration, parse_time
from fleetlens.simulator.scenario import ScenarioError, parse_start

NOW = 1_795_000_000 * 10**9


@pytest.mark.parametrize("text,seconds", [
    ("850ms", 0.85), ("850 ms", 0.85), ("1.5s", 1.5), ("30 sec", 30), ("15m", 900),
    ("15min", 900), ("2h", 7200), ("7d", 604800), ("1w", 604800), ("250us", 250e-6),
    ("250µs", 250e-6), ("40ns", 40e-9),
])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["", "2", "h", "2 hours", "-5m", "2h30m", "1e3s"])
def test_not_durations_say_what_to_write(bad: str) -> None:
    with pytest.raises(ValueError, match="not a duration; use e.g."):
        parse_duration(bad)


@pytest.mark.parametrize("text,expected", [
    ("now", NOW), ("now-2h", NOW - 7200 * 10**9), ("now - 90s", NOW - 90 * 10**9),
    ("now+5m", NOW + 300 * 10**9), ("2h", NOW - 7200 * 10**9),
    ("2026-11-29T23:30:00Z", 1_795_995_000 * 10**9),
    ("2026-11-29T23:30:00", 1_795_995_000 * 10**9),  # UTC when no zone is given
    ("2026-11-30T00:30:00+01:00", 1_795_995_000 * 10**9),
    ("1795995000", 1_795_995_000 * 10**9), ("1795995000000", 1_795_995_000 * 10**9),
    ("1795995000000000", 1_795_995_000 * 10**9), ("1795995000000000000", 1_795_995_000 * 10**9),
])
def test_times(text: str, expected: int) -> None:
    assert parse_time(text, NOW) == expected
    assert parse_since(text, NOW) == expected  # --since speaks the same grammar


def test_the_same_text_means_the_same_everywhere() -> None:
    rule = parse_rule("p99(ttft) > 850ms for 2m")
    assert (rule.threshold_s, rule.for_s) == (parse_duration("850ms"), parse_duration("2m"))
    assert parse_rule("p99(e2e) >= 1.5 s").threshold_s == 1.5
    assert parse_start("2026-11-29T23:30:00Z") == parse_time("2026-11-29T23:30:00Z")
    import time

    assert abs(parse_start("now-2h") - parse_time("now-2h")) <= 60 * 10**9  # minute-rounded
    with pytest.raises(ScenarioError, match="not a time"):
        parse_start("last tuesday")
    with pytest.raises(ValueError, match="not a time; use now, now-2h"):
        parse_time("yesterday", time.time_ns())


@pytest.mark.parametrize("host,resolve,expected", [
    ("127.0.0.1", False, True), ("127.5.0.9", False, True), ("::1", False, True),
    ("[::1]", False, True), ("localhost", False, True), ("0.0.0.0", False, False),
    ("10.1.2.3", False, False), ("::", False, False), ("", True, False),
    ("gpu-07.example", False, False),  # a client never trusts a name it did not resolve
    ("no-such-host.invalid", True, False),
])
def test_one_loopback_check(host: str, resolve: bool, expected: bool) -> None:
    from fleetlens.pipeline.schema.settings import is_loopback

    assert is_loopback(host, resolve=resolve) is expected


def test_one_toml_writer_reads_back() -> None:
    import tomllib

    from fleetlens.pipeline.schema.settings import to_toml

    data = {"collector": {"grpc_address": "127.0.0.1:4317", "auth_tokens": ("a", 'b"c'),
                          "flush_interval_s": 0.2, "workers": 2, "tls": {"cert_file": None},
                          "forward": {"insecure": True}},
            "analytics": {"webhooks": [{"url": "http://x/h", "format": "slack"}]},
            "agent": {"gpu_models": {"NVIDIA H100 80GB HBM3": "H100"}}}
    text = to_toml(data)
    back = tomllib.loads(text)
    assert back["collector"]["auth_tokens"] == ["a", 'b"c']
    assert back["collector"]["flush_interval_s"] == 0.2 and back["collector"]["workers"] == 2
    assert "cert_file" not in back["collector"]["tls"] and "# cert_file = (unset)" in text
    assert back["analytics"]["webhooks"] == data["analytics"]["webhooks"]
    assert back["agent"]["gpu_models"] == data["agent"]["gpu_models"]  # a quoted key
