"""A GPU throttling by heat is a hardware warning even when no latency moved (issue 30 item
2), and no second incident where a latency incident already names the throttle."""

from __future__ import annotations

import json

import polars as pl
import pytest

from fleetlens.analytics.failures.absorb import WARNING_KEY, absorb_throttles
from fleetlens.analytics.failures.config import FailureConfig
from fleetlens.analytics.failures.detect import outage_periods
from fleetlens.analytics.failures.findings import to_tables
from fleetlens.analytics.failures.throttles import thermal_throttles
from fleetlens.analytics.merge import incidents_frame
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.schema.settings import ConfigError

NS = 1_000_000_000
T0 = 1_767_225_600 * NS
HOT, CAPPED, BRIEF, HW = "GPU-hot", "GPU-capped", "GPU-brief", "GPU-hw"
#: NVML clocks event reasons: idle, SW power cap, HW slowdown, SW / HW thermal slowdown
IDLE, POWER_CAP, HW_SLOWDOWN, SW_THERMAL, HW_THERMAL = 0x1, 0x4, 0x8, 0x20, 0x40


def _gpu(uuid: str, host: str, index: int, reasons_at, seconds: int = 1200) -> pl.DataFrame:
    """One GPU sampled every 10 s; ``reasons_at(s)``: its reason bits ``s`` seconds in. A
    thermal bit comes with the clock down to 1350 MHz and 87 C (else 1980 MHz, 62 C)."""
    rows = []
    for s in range(0, seconds, 10):
        bits = reasons_at(s)
        hot = bool(bits & (SW_THERMAL | HW_THERMAL | HW_SLOWDOWN))
        rows.append({c.TS_NS: T0 + s * NS, c.HOST_NAME: host, c.GPU_INDEX: index,
                     c.GPU_UUID: uuid, c.CLOCKS_EVENT_REASONS: bits,
                     c.TEMP_C: 87.0 if hot else 62.0,
                     c.SM_CLOCK_MHZ: 1350.0 if hot else (210.0 if bits & IDLE else 1980.0)})
    return pl.DataFrame(rows)


def _samples() -> pl.DataFrame:
    return pl.concat([
        # hot from 600 s to 720 s (13 samples), idle now and then before
        _gpu(HOT, "h01", 0, lambda s: SW_THERMAL if 600 <= s <= 720 else
             (IDLE if s % 100 == 0 else 0)),
        # at its power limit all along: a healthy GPU at full load, no warning
        _gpu(CAPPED, "h01", 1, lambda s: POWER_CAP),
        # hot for 40 s only: the driver doing its job
        _gpu(BRIEF, "h02", 0, lambda s: SW_THERMAL if 300 <= s < 350 else 0),
        # HW thermal and HW slowdown flickering (a sample in two clear) to the end of the data
        _gpu(HW, "h03", 0, lambda s: 0 if s < 900 or s % 20 else HW_THERMAL | HW_SLOWDOWN),
    ])


def _found(cfg: FailureConfig | None = None) -> dict:
    services = {HOT: "chat", CAPPED: "chat", BRIEF: "chat", HW: "big"}
    found = thermal_throttles(_samples().lazy(), services, 60 * NS, cfg or FailureConfig())
    return {f.evidence[c.GPU_UUID]: f for f in found}


def test_a_gpu_hot_for_a_minute_is_one_warning_with_what_heat_did_to_its_clock() -> None:
    found = _found()
    assert set(found) == {HOT, HW}  # not the power cap, not 40 s of heat
    hot = found[HOT]
    assert (hot.cause, hot.subject, hot.host, hot.service) == (
        "thermal_throttle", f"gpu_uuid={HOT}", "h01", "chat")
    assert (hot.start_ns, hot.end_ns) == (T0 + 600 * NS, T0 + 720 * NS)
    assert hot.detected_ns == T0 + 660 * NS  # sure once it lasted throttle_after_s
    ev = hot.evidence
    assert ev["reasons"] == ["sw_thermal_slowdown"] and ev["peak_temp_c"] == 87.0
    # its own busy clock before (idle samples are no clock to compare) against while hot
    assert (ev["sm_clock_before_mhz"], ev["sm_clock_mhz"]) == (1980.0, 1350.0)
    assert ev["clock_drop"] == pytest.approx(0.318, abs=1e-3)
    assert ev["throttled_s"] == 120 and ev["ongoing"] is False
    assert hot.summary == (f"GPU {HOT} (h01:0) throttled by heat for 120 s at up to 87 C "
                           "(sw_thermal_slowdown): SM clock 1980 -> 1350 MHz (-32%)")
    hw = found[HW]
    assert hw.evidence["reasons"] == ["hw_slowdown", "hw_thermal_slowdown"]
    assert hw.evidence["ongoing"] is True and hw.summary.endswith("(still)")
    assert hw.evidence["thermal_share"] == pytest.approx(0.5, abs=0.05)
    incidents, causes = to_tables(list(found.values()))
    assert set(incidents[c.SEVERITY]) == {"warning"}
    assert set(incidents[c.DETECTOR]) == {"failure:thermal_throttle"}
    assert set(causes[c.CAUSE]) == {"thermal_throttle"}


def test_the_duration_is_a_setting_and_a_hot_gpu_is_no_outage() -> None:
    assert set(_found(FailureConfig(throttle_after_s=150))) == {HW}
    with pytest.raises(ConfigError, match="throttle_after_s"):
        FailureConfig(throttle_after_s=0).validate()
    # a throttling GPU still serves: its period stays in the baselines
    assert outage_periods(list(_found().values())).is_empty()


def test_gpus_of_one_host_hot_together_are_the_hosts_warning() -> None:
    both = pl.concat([_gpu(f"GPU-{i}", "h05", i, lambda s: SW_THERMAL if s >= 300 else 0)
                      for i in range(2)])
    (found,) = thermal_throttles(both.lazy(), {}, 60 * NS, FailureConfig())
    assert found.subject == "host_name=h05" and found.evidence["gpus"] == ["GPU-0", "GPU-1"]
    assert found.summary.startswith("2 GPUs of h05: ")


def _latency(incident: str, host: str, service: str, start_s: int, end_s: int,
             causes: list[tuple[str, str]]) -> tuple[dict, list[dict]]:
    row = {c.INCIDENT_ID: incident, c.METRIC: "tpot_p99_s", c.SERVICE_NAME: service,
           c.MODEL: "m", c.HOST_NAME: host, c.START_NS: T0 + start_s * NS,
           c.END_NS: T0 + end_s * NS, c.PEAK: 2.0, c.EXPECTED: 1.0, c.SEVERITY: "minor",
           c.DETECTOR: "band"}
    return row, [{c.INCIDENT_ID: incident, c.RANK: rank, c.CAUSE: cause, c.SUBJECT: subject,
                  c.SCORE: 0.5, c.SHARE_OF_EXCESS: 0.5, c.EVIDENCE: json.dumps({"x": 1}),
                  c.SUMMARY: "s"} for rank, (cause, subject) in enumerate(causes, 1)]


def _absorb(*latency: tuple[dict, list[dict]]) -> tuple[list, pl.DataFrame]:
    found = list(_found().values())
    incidents = incidents_frame([row for row, _ in latency])
    causes = pl.DataFrame([r for _, rows in latency for r in rows],
                          schema=dict(t.table(t.CAUSES).columns))
    return absorb_throttles(incidents, causes, found, 60)


def test_a_latency_incident_that_names_the_throttle_takes_the_warning_in() -> None:
    left, causes = _absorb(
        # h01's incident ranks the throttle second, on the hot GPU: one story
        _latency("a", "h01", "chat", 660, 900, [("traffic_surge", "service_name=chat"),
                                                ("thermal_throttle", f"gpu_uuid={HOT}")]),
        # the service-wide one of h03's service names a power cap on h03
        _latency("b", "*", "big", 1000, 1200, [("power_cap", "host_name=h03")]))
    assert left == []
    evidence = {(r[c.INCIDENT_ID], r[c.RANK]): json.loads(r[c.EVIDENCE])
                for r in causes.iter_rows(named=True)}
    assert WARNING_KEY not in evidence[("a", 1)]
    assert evidence[("a", 2)]["x"] == 1  # the cause's own evidence stays
    assert evidence[("a", 2)][WARNING_KEY][c.GPU_UUID] == HOT
    assert evidence[("a", 2)][WARNING_KEY]["peak_temp_c"] == 87.0
    assert evidence[("b", 1)][WARNING_KEY][c.GPU_UUID] == HW


def test_a_warning_no_latency_incident_explains_stays_a_warning() -> None:
    left, causes = _absorb(
        # on its host and time, but naming something else
        _latency("a", "h01", "chat", 600, 900, [("kv_cache_pressure", "host_name=h01")]),
        # naming the throttle, but long after it ended
        _latency("b", "h01", "chat", 2000, 2300, [("thermal_throttle", f"gpu_uuid={HOT}")]),
        # naming a throttle on another GPU of another service
        _latency("c", "*", "chat", 900, 1200, [("thermal_throttle", f"gpu_uuid={CAPPED}")]))
    assert sorted(f.evidence[c.GPU_UUID] for f in left) == [HOT, HW]
    assert not causes[c.EVIDENCE].str.contains(WARNING_KEY).any()


def test_a_warning_is_below_minor_everywhere_severities_are_read() -> None:
    from fleetlens.analytics.config import SEVERITIES
    from fleetlens.analytics.webhook_formats import pagerduty_event, summary
    from fleetlens.dashboard.failures import is_failure

    assert SEVERITIES == ("warning", "minor", "major", "critical")
    found = _found()[HOT]
    incidents, causes = to_tables([found])
    inc = incidents.row(0, named=True)
    snapshot = {"incident": inc, "causes": causes.to_dicts()}
    assert summary(snapshot).startswith(
        "warning failure on chat/h01: thermal_throttle (gpu_uuid=GPU-hot): GPU GPU-hot")
    assert pagerduty_event(snapshot, "key", "trigger", None)["payload"]["severity"] == "info"
    # the dashboard shows it on the failure page: no latency analysis of a band
    assert is_failure(inc)
