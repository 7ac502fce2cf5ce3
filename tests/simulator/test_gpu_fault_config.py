"""gpu_fault and config_change: their telemetry contract and ground truth (issue 30).

Same fleet, seed and window as test_failures.py (h01, h02: two 1-GPU ``chat`` engines each,
``max_num_seqs`` 32, every request through the gateway; h03: a TP-2 ``big`` engine), one
incident over [60 s, 180 s); the samples at 70..180 s fall inside it.
"""

from __future__ import annotations

import hashlib
import json

import pytest
from opentelemetry.sdk.metrics.export import Gauge, Sum
from opentelemetry.sdk.resources import Resource

from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema.causes import Cause, subject
from fleetlens.simulator import parse_scenario
from fleetlens.simulator.fleet import Fleet
from fleetlens.simulator.metrics import ENGINE_SCOPE, GPU_METRICS, GPU_SCOPE, metrics_data
from fleetlens.simulator.scenario import ScenarioError
from tests.simulator.helpers import Outcome, host_of, tpot
from tests.simulator.test_failures import (
    CRASH_NS,
    RESTART_NS,
    S,
    engine_points,
    gateway_errors,
    inside,
    instance_of,
    run_case,
)
from tests.simulator.test_incidents import START, baseline, doc, identical_elsewhere

__all__ = ["baseline"]  # the module-scoped fixture of test_incidents, run once here too


def gpu_points(o: Outcome, host: str, index: int, metric: str) -> list[tuple[int, dict, float]]:
    return sorted((ts, at, v) for h, n, at, v, ts in o.points
                  if h == host and n == metric and at.get(a.GPU_INDEX) == index)


def configs(o: Outcome, instance: str) -> list[tuple[int, dict]]:
    """(ts, attributes) of the engine's fleetlens.engine.config points (value 1 each)."""
    points = [(ts, at, v) for _, n, at, v, ts in o.points
              if n == a.ENGINE_CONFIG_INFO and at[a.ENGINE_INSTANCE] == instance]
    assert {v for _, _, v in points} <= {1}
    return sorted((ts, at) for ts, at, _ in points)


def test_without_these_incidents_every_gpu_answers_and_configs_hold(baseline) -> None:
    samples = sorted({ts for *_, ts in baseline.points})
    for host in ("h01", "h02", "h03"):
        for index in (0, 1):
            lost = gpu_points(baseline, host, index, a.GPU_LOST)
            assert [ts for ts, _, _ in lost] == samples and {v for *_, v in lost} == {0}
            _, attrs, _ = lost[0]
            usual = gpu_points(baseline, host, index, a.HW_POWER)[0][1]
            assert attrs == {**usual, a.HW_VENDOR: a.HW_VENDOR_NVIDIA,
                             a.HW_MODEL: usual[a.HW_NAME]}
    assert not [p for p in baseline.points if p[1] == a.GPU_XID_ERRORS]
    for iid in ("h01/chat/0", "h01/chat/1", "h02/chat/0", "h02/chat/1", "h03/big"):
        points = configs(baseline, iid)
        assert [ts for ts, _ in points] == samples
        (attrs,) = {json.dumps(at, sort_keys=True) for _, at in points}
        attrs = json.loads(attrs)
        text = attrs[a.ENGINE_CONFIG_JSON]
        assert attrs[a.ENGINE_CONFIG_FINGERPRINT] == hashlib.sha256(
            text.encode()).hexdigest()[:16]
        assert attrs[a.ENGINE_VERSION] == "0.11.0"
        config = json.loads(text)
        assert text == json.dumps(config, sort_keys=True, separators=(",", ":"))
        assert config["version"] == "0.11.0"
        assert set(config["cache_config"]) >= {"block_size", "num_gpu_blocks",
                                              "enable_prefix_caching", "max_num_seqs"}
        assert all(isinstance(v, str) for v in config["cache_config"].values())
    chat = json.loads(configs(baseline, "h01/chat/0")[0][1][a.ENGINE_CONFIG_JSON])
    assert chat["models"] == {"meta-llama/Llama-3.1-8B-Instruct": 32768}
    assert chat["cache_config"]["num_gpu_blocks"] == "4000"
    assert chat["cache_config"]["max_num_seqs"] == "32"
    big = json.loads(configs(baseline, "h03/big")[0][1][a.ENGINE_CONFIG_JSON])
    assert big["cache_config"]["tensor_parallel_size"] == "2"
    # the point counts the run reports include the new points
    assert baseline.result.points == len(baseline.points)


def test_gpu_fault_loses_the_gpu_and_its_engine_restarts(baseline) -> None:
    out = run_case("gpu_fault", gpu="h01:1")
    dead, uuid = "h01/chat/1", gpu_points(baseline, "h01", 1, a.HW_POWER)[0][1][a.HW_ID]
    lost = gpu_points(out, "h01", 1, a.GPU_LOST)
    assert {v for ts, _, v in lost if inside(ts)} == {1}
    assert {v for ts, _, v in lost if not inside(ts)} == {0}
    assert {at[a.HW_ID] for _, at, _ in lost} == {uuid}
    xid = gpu_points(out, "h01", 1, a.GPU_XID_ERRORS)
    assert xid and min(ts for ts, _, _ in xid) == CRASH_NS + 10 * S  # none before the Xid
    assert {(at[a.GPU_XID_CODE], v) for _, at, v in xid} == {(79, 1)}  # counted once, kept
    assert max(ts for ts, _, _ in xid) > RESTART_NS
    assert [p for p in out.points if p[1] == a.GPU_XID_ERRORS] == [
        p for p in out.points if p[1] == a.GPU_XID_ERRORS and p[0] == "h01"
        and p[2][a.GPU_INDEX] == 1]
    for h, n, at, v, _ in out.points:
        if n == a.GPU_LOST and (h, at[a.GPU_INDEX]) != ("h01", 1):
            assert v == 0
    # the lost GPU's usual metrics are absent, as the agent skips it; back after the fault
    for name in GPU_METRICS:
        times = [ts for ts, _, _ in gpu_points(out, "h01", 1, name)]
        assert not [ts for ts in times if inside(ts)]
        assert RESTART_NS + 10 * S in times and CRASH_NS in times
    assert [ts for ts, _, _ in gpu_points(out, "h01", 0, a.HW_POWER) if inside(ts)]
    # its engine dies as at engine_down, then restarts cold
    up = engine_points(out, dead, a.ENGINE_UP)
    assert {v for ts, v in up if inside(ts)} == {0} and {v for ts, v in up if not inside(ts)} \
        == {1}
    assert set(gateway_errors(out, dead)) == {502, 503} and set(gateway_errors(out)) == {502, 503}
    assert not [s for s in out.requests() if instance_of(s) == dead
                and CRASH_NS <= s.start_time < RESTART_NS]
    started = engine_points(out, dead, a.ENGINE_START_TIME)
    assert {v for ts, v in started if ts > RESTART_NS} == {RESTART_NS / S}
    assert not [ts for ts, _ in configs(out, dead) if inside(ts)]
    fault, restart = out.result.ground_truth["incidents"]
    assert (fault["cause"], fault["subject"]) == (Cause.GPU_FAULT, subject(c.GPU_UUID, uuid))
    assert (fault["gpus"], fault["instances"]) == ([uuid], [dead])
    assert (restart["cause"], restart["subject"]) == (Cause.ENGINE_RESTART,
                                                      subject(c.INSTANCE_ID, dead))
    assert (restart[c.START_NS], restart[c.END_NS]) == (RESTART_NS, RESTART_NS + 60 * S)
    identical_elsewhere(out, baseline, {"h01"})


def test_gpu_fault_on_a_tensor_parallel_group_kills_the_whole_engine(baseline) -> None:
    out = run_case("gpu_fault", gpu="h03:1")
    up = engine_points(out, "h03/big", a.ENGINE_UP)
    assert {v for ts, v in up if inside(ts)} == {0}
    assert {v for ts, _, v in gpu_points(out, "h03", 0, a.GPU_LOST)} == {0}  # its peer answers
    assert [ts for ts, _, _ in gpu_points(out, "h03", 0, a.HW_POWER) if inside(ts)]
    fault, restart = out.result.ground_truth["incidents"]
    assert restart["subject"] == subject(c.INSTANCE_ID, "h03/big")
    identical_elsewhere(out, baseline, {"h03"})


def test_config_change_restarts_with_the_new_config_then_rolls_back(baseline) -> None:
    out = run_case("config_change", service="chat", gpu="h02:0",
                   set={"max_num_seqs": 2, "version": "0.11.1"})
    iid = "h02/chat/0"
    old = {json.dumps(at, sort_keys=True) for _, at in configs(baseline, iid)}
    points = configs(out, iid)
    assert {json.dumps(at, sort_keys=True) for ts, at in points if not inside(ts)} == old
    (new,) = {json.dumps(at, sort_keys=True) for ts, at in points if inside(ts)}
    new, (old,) = json.loads(new), [json.loads(x) for x in old]
    assert new[a.ENGINE_VERSION] == "0.11.1"
    assert new[a.ENGINE_CONFIG_FINGERPRINT] != old[a.ENGINE_CONFIG_FINGERPRINT]
    assert new[a.ENGINE_CONFIG_FINGERPRINT] == hashlib.sha256(
        new[a.ENGINE_CONFIG_JSON].encode()).hexdigest()[:16]
    config, before = json.loads(new[a.ENGINE_CONFIG_JSON]), json.loads(old[a.ENGINE_CONFIG_JSON])
    assert config["version"] == "0.11.1" and config["cache_config"]["max_num_seqs"] == "2"
    assert {**config["cache_config"], "max_num_seqs": "32"} == before["cache_config"]
    # the setting bounds the batch only while it is in effect
    running = engine_points(out, iid, a.ENGINE_NUM_RUNNING)
    assert max(v for ts, v in running if inside(ts)) == 2
    assert max(v for ts, v in engine_points(baseline, iid, a.ENGINE_NUM_RUNNING)
               if inside(ts)) > 2
    assert max(v for ts, v in running if ts > RESTART_NS + 30 * S) > 2
    # two quick restarts: new start times, nothing refused, the held requests lost
    started = engine_points(out, iid, a.ENGINE_START_TIME)
    assert {v for ts, v in started if inside(ts)} == {CRASH_NS / S}
    assert {v for ts, v in started if ts > RESTART_NS} == {RESTART_NS / S}
    assert {v for _, v in engine_points(out, iid, a.ENGINE_UP)} == {1}
    errors = gateway_errors(out)
    assert set(errors) == {502}
    assert {s.end_time for s in errors[502]} == {CRASH_NS, RESTART_NS}
    assert {s.attributes[a.FLEETLENS_INSTANCE_ID] for s in errors[502]} == {iid}
    # the ground truth: one item, what changed, no separate restart
    (item,) = out.result.ground_truth["incidents"]
    assert (item["cause"], item["subject"]) == (Cause.CONFIG_CHANGE, subject(c.INSTANCE_ID, iid))
    assert (item[c.START_NS], item[c.END_NS]) == (CRASH_NS, RESTART_NS)
    assert item["changes"] == ["max_num_seqs 32 -> 2", "version 0.11.0 -> 0.11.1"]
    identical_elsewhere(out, baseline, {"h02"})


def test_config_change_of_step_overhead_slows_every_engine_of_the_service(baseline) -> None:
    out = run_case("config_change", service="chat", set={"step_overhead_ms": 40})
    def decode(o, lo, hi):
        spans = [tpot(s) for s in o.requests() if host_of(s) != "h03"
                 and lo <= s.start_time and s.end_time < hi]
        return sum(spans) / len(spans)
    during = decode(out, CRASH_NS + 5 * S, RESTART_NS)
    assert during > decode(baseline, CRASH_NS + 5 * S, RESTART_NS) + 0.03
    assert decode(out, RESTART_NS + 20 * S, RESTART_NS + 60 * S) < during / 3
    (item,) = out.result.ground_truth["incidents"]
    assert item["subject"] == subject(c.SERVICE_NAME, "chat")
    assert item["changes"] == ["step_overhead_ms 2.0 -> 40.0"]
    assert item["instances"] == ["h01/chat/0", "h01/chat/1", "h02/chat/0", "h02/chat/1"]
    identical_elsewhere(out, baseline, {"h01", "h02"})


def test_health_and_config_metrics_have_the_agents_units_and_kinds() -> None:
    collection = ("h01", 5, {GPU_SCOPE: {
        a.GPU_XID_ERRORS: [({a.GPU_XID_CODE: 79}, 1)], a.GPU_LOST: [({}, 1)]},
        ENGINE_SCOPE: {a.ENGINE_CONFIG_INFO: [({a.ENGINE_INSTANCE: "i"}, 1)]}})
    data = metrics_data([collection], {"h01": Resource({})}, 3)
    metrics = {m.name: m for sm in data.resource_metrics[0].scope_metrics for m in sm.metrics}
    xid = metrics[a.GPU_XID_ERRORS]
    assert xid.unit == "{error}" and isinstance(xid.data, Sum) and xid.data.is_monotonic
    assert xid.data.data_points[0].start_time_unix_nano == 3
    assert metrics[a.GPU_LOST].unit == "1" and isinstance(metrics[a.GPU_LOST].data, Gauge)
    config = metrics[a.ENGINE_CONFIG_INFO]
    assert config.unit == "1" and isinstance(config.data, Gauge)


@pytest.mark.parametrize("incident,message", [
    ({"kind": "gpu_fault", "host": "h01"}, "gpu_fault takes exactly one GPU"),
    ({"kind": "gpu_fault", "gpu": "h01:0", "service": "chat"}, "gpu_fault takes exactly one"),
    ({"kind": "config_change", "service": "chat"}, "config_change needs 'set'"),
    ({"kind": "config_change", "service": "chat", "set": {}}, "expected a non-empty table"),
    ({"kind": "config_change", "service": "chat", "set": 3}, "expected a non-empty table"),
    ({"kind": "config_change", "service": "chat", "set": {"tp": 2}},
     "unknown setting 'tp'"),
    ({"kind": "config_change", "service": "chat", "set": {"max_num_seqs": 0}},
     "set.max_num_seqs: expected an integer >= 1, got 0"),
    ({"kind": "config_change", "service": "chat", "set": {"max_num_seqs": 2.5}},
     "set.max_num_seqs: expected an integer"),
    ({"kind": "config_change", "service": "chat", "set": {"prefix_caching": 1}},
     "set.prefix_caching: expected true/false"),
    ({"kind": "config_change", "service": "chat", "set": {"version": " "}},
     "set.version: expected a non-empty string"),
    ({"kind": "config_change", "service": "chat", "set": {"step_overhead_ms": -1}},
     "set.step_overhead_ms: expected a number >= 0.0"),
    ({"kind": "config_change", "service": "chat", "set": {"max_num_seqs": 32}},
     "changes nothing"),
    ({"kind": "config_change", "host": "h01", "set": {"max_num_seqs": 2}},
     "config_change needs a 'service'"),
    ({"kind": "thermal_throttle", "host": "h01", "set": {"max_num_seqs": 2}},
     "only a config_change takes 'set'"),
])
def test_a_gpu_fault_or_config_change_that_could_not_show_is_refused(incident, message) -> None:
    document = doc([{"start_s": START, "duration_s": 60, **incident}])
    with pytest.raises(ScenarioError) as info:
        Fleet(parse_scenario(document), 1)
    assert message in str(info.value) and "[[incident]] #1" in str(info.value)
