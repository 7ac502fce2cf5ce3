from __future__ import annotations

import dataclasses

import polars as pl

from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.detect import band_breaches, detect
from fleetlens.analytics.merge import incident_id, merge_anomalies, severity
from fleetlens.pipeline.schema import FLEET_WIDE, validate
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

from .conftest import NS, T0

W = 60


def _banded(values, host="h01", service="chat", requests=100, metric="e2e_p99_s"):
    n = len(values)
    level = "host" if host != FLEET_WIDE else ("fleet" if service == FLEET_WIDE else "service")
    reqs = requests if isinstance(requests, list) else [requests] * n
    return pl.DataFrame({
        c.SERIES: [f"{metric}{{{service},{host}}}"] * n, c.METRIC: [metric] * n,
        c.SERVICE_NAME: [service] * n, c.MODEL: ["m"] * n, c.HOST_NAME: [host] * n,
        c.LEVEL: [level] * n, c.TS_NS: [T0 + i * W * NS for i in range(n)],
        c.VALUE: [float(v) for v in values], c.REQUESTS: reqs,
        c.EXPECTED: [1.0] * n, c.LOWER: [0.8] * n, c.UPPER: [1.2] * n,
    })


def test_k_consecutive_windows_make_a_breach(config) -> None:
    frame = _banded([1, 2, 2, 1, 2, 2, 2, 2, 1])
    out = band_breaches(frame, config, W).collect()
    assert out.height == 1  # the 2-window run is too short (consecutive = 3)
    row = out.row(0, named=True)
    assert row[c.START_NS] == T0 + 4 * W * NS and row[c.END_NS] == T0 + 8 * W * NS
    assert row[c.DETECTED_NS] == T0 + 7 * W * NS  # when the 3rd window closed
    assert row[c.PEAK] == 2.0 and row[c.EXPECTED] == 1.0


def test_gaps_and_thin_windows_break_runs(config) -> None:
    gap = _banded([2, 2, 2, 2]).with_columns(
        pl.Series(c.TS_NS, [T0, T0 + W * NS, T0 + 5 * W * NS, T0 + 6 * W * NS]))
    assert band_breaches(gap, config, W).collect().height == 0
    thin = _banded([2, 2, 2, 2], requests=[100, 5, 100, 100])
    assert band_breaches(thin, config, W).collect().height == 0
    only_metric = dataclasses.replace(config, detect_metrics=("ttft_p99_s",))
    assert band_breaches(_banded([2] * 5), only_metric, W).collect().height == 0


def test_a_median_is_judged_on_fewer_requests_than_a_tail(config) -> None:
    # Random fleet 11011: a KV pressure (TTFT p90 x72) on an instance serving 15 requests a
    # minute went unjudged: every window was under min_requests (20).
    median = _banded([1, 3, 3, 3, 1], requests=12, metric="ttft_p50_s")
    tail = _banded([1, 3, 3, 3, 1], requests=12, metric="ttft_p99_s")
    found = detect(pl.concat([median, tail]), config, W)
    assert found[c.METRIC].to_list() == ["ttft_p50_s"]


def test_detect_combines_band_and_slo(config) -> None:
    cfg = dataclasses.replace(config, slo_rules=("p99(e2e) > 1.5 s",))
    out = detect(_banded([1, 2, 2, 2, 1]), cfg, W)
    assert sorted(out[c.DETECTOR].to_list()) == ["band", "slo:p99(e2e) > 1.5 s"]


def _anomalies(*frames) -> pl.DataFrame:
    return detect(pl.concat(frames), AnalyticsConfig(), W)


def test_one_cause_at_three_levels_is_one_host_incident(config) -> None:
    host = _banded([1, 3, 3, 3, 3, 1], host="h07")
    service = _banded([1, 1, 2, 2, 2, 1], host=FLEET_WIDE)
    fleet = _banded([1, 1, 2, 2, 2, 1], host=FLEET_WIDE, service=FLEET_WIDE)
    out = merge_anomalies(_anomalies(host, service, fleet), {("chat", "m"): 8}, config)
    validate(out, t.INCIDENTS)
    assert out.height == 1
    row = out.row(0, named=True)
    assert (row[c.HOST_NAME], row[c.LEVEL], row[c.START_NS]) == ("h07", "host", T0 + W * NS)
    assert row[c.END_NS] == T0 + 5 * W * NS
    assert row[c.PEAK] == 3.0 and row[c.SEVERITY] == "critical"
    assert row[c.INCIDENT_ID] == incident_id("chat", "m", "h07", T0 + W * NS)


def test_two_hosts_at_once_stay_two_incidents(config) -> None:
    a = _banded([1, 3, 3, 3, 1], host="h01")
    b = _banded([1, 1, 2, 2, 2], host="h05")
    out = merge_anomalies(_anomalies(a, b), {("chat", "m"): 8}, config)
    assert sorted(out[c.HOST_NAME]) == ["h01", "h05"]


def test_most_hosts_at_once_is_one_service_incident(config) -> None:
    frames = [_banded([1, 3, 3, 3, 1], host=f"h0{i}") for i in range(3)]
    out = merge_anomalies(_anomalies(*frames), {("chat", "m"): 4}, config)
    assert out.height == 1 and out[c.HOST_NAME][0] == FLEET_WIDE
    assert out[c.LEVEL][0] == "service"


def test_both_hosts_breaching_minutes_apart_are_two_faults(config) -> None:
    # Random fleet 7004: a collective stall on h02 and, 3 minutes later, engine overhead on
    # h01 (both hosts of the service) were one service incident ranked engine_overhead.
    a = _banded([1, 3, 3, 3, 3, 3, 3, 1, 1], host="h02")
    b = _banded([1, 1, 1, 1, 3, 3, 3, 3, 3], host="h01")
    out = merge_anomalies(_anomalies(a, b), {("chat", "m"): 2}, config)
    assert sorted(out[c.HOST_NAME]) == ["h01", "h02"] and set(out[c.LEVEL]) == {"host"}
    # the same two hosts starting together are one shared cause
    b = _banded([1, 3, 3, 3, 3, 3, 3, 3, 3], host="h01")
    out = merge_anomalies(_anomalies(a, b), {("chat", "m"): 2}, config)
    assert out.height == 1 and out[c.LEVEL][0] == "service"


def test_fleet_alone_and_separate_times(config) -> None:
    fleet = _banded([1, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1], host=FLEET_WIDE, service=FLEET_WIDE)
    late = _banded([1] * 8 + [2, 2, 2, 1], host="h02")
    out = merge_anomalies(_anomalies(fleet, late), {("chat", "m"): 4}, config)
    assert out[c.LEVEL].to_list() == ["fleet", "host"]


def test_severity_levels(config) -> None:
    assert severity(1.3, False, config) == "minor"
    assert severity(1.3, True, config) == "major"
    assert severity(2.0, False, config) == "major"
    assert severity(3.5, False, config) == "critical"


def test_no_anomalies_no_incidents(config) -> None:
    out = merge_anomalies(_anomalies(_banded([1] * 5)), {}, config)
    assert out.height == 0
    validate(out, t.INCIDENTS)
