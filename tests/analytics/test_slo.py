from __future__ import annotations

import polars as pl
import pytest

from fleetlens.analytics.detect import slo_breaches
from fleetlens.analytics.slo import parse_rule
from fleetlens.pipeline.schema import columns as c

from .conftest import NS, T0


def test_parse_plain_rule() -> None:
    rule = parse_rule("p99(e2e) > 850 ms")
    assert rule.column == c.percentile_column("e2e", "p99")
    assert rule.threshold_s == pytest.approx(0.85)
    assert not rule.inclusive and rule.for_s == 0
    assert rule.windows_needed(60) == 1


def test_parse_rule_with_duration() -> None:
    rule = parse_rule("p99(ttft) >= 200 ms for 10 s")
    assert rule.column == c.percentile_column("ttft", "p99")
    assert rule.inclusive and rule.for_s == 10
    assert rule.windows_needed(10) == 1
    assert rule.windows_needed(5) == 2
    assert parse_rule("p50(e2e) > 2 s for 3 min").windows_needed(60) == 3


@pytest.mark.parametrize("bad", ["p99(e2e) 850 ms", "p99(foo) > 1 s", "p98(e2e) > 1 s",
                                 "p99(e2e) > 1 parsec", ""])
def test_bad_rules_name_the_problem(bad: str) -> None:
    with pytest.raises(ValueError, match="SLO rule|cannot parse"):
        parse_rule(bad)


def _series(values: list[float]) -> pl.DataFrame:
    n = len(values)
    return pl.DataFrame({
        c.SERIES: ["s"] * n, c.METRIC: [c.percentile_column("e2e", "p99")] * n,
        c.SERVICE_NAME: ["chat"] * n, c.MODEL: ["m"] * n, c.HOST_NAME: ["*"] * n,
        c.LEVEL: ["service"] * n, c.TS_NS: [T0 + i * 10 * NS for i in range(n)],
        c.VALUE: values, c.REQUESTS: [100] * n,
    })


def test_slo_rule_needs_its_duration() -> None:
    frame = _series([0.1, 0.3, 0.1, 0.3, 0.3, 0.1, 0.25, 0.25, 0.25, 0.1])
    out = slo_breaches(frame, ["p99(e2e) > 200 ms for 20 s"], window_s=10).collect().sort(
        c.START_NS)
    # runs of 1 window are ignored; runs of 2 and 3 windows are breaches
    assert out[c.START_NS].to_list() == [T0 + 3 * 10 * NS, T0 + 6 * 10 * NS]
    assert out[c.END_NS].to_list() == [T0 + 5 * 10 * NS, T0 + 9 * 10 * NS]
    assert out[c.PEAK].to_list() == [0.3, 0.25]
    assert out[c.EXPECTED].to_list() == [0.2, 0.2]
    assert out[c.DETECTOR].to_list() == ["slo:p99(e2e) > 200 ms for 20 s"] * 2
    # detected once the 2nd bad window has closed
    assert out[c.DETECTED_NS].to_list() == [T0 + 5 * 10 * NS, T0 + 8 * 10 * NS]
