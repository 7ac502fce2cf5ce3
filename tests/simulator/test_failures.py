"""Failure incidents: the telemetry contract of issue 30, kind by kind.

Same fleet and seed as test_incidents.py (h01, h02: two 1-GPU ``chat`` engines each, every
request through the gateway; h03: one TP-2 ``big`` engine without a gateway), one incident
over [60 s, 180 s). Samples are taken every 10 s at the end of a tick; an incident applies
from the tick that starts at its start, so the samples at 70..180 s fall inside it.
"""

from __future__ import annotations

import json

import pytest
from opentelemetry.sdk.metrics.export import Gauge
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import StatusCode

from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema.causes import Cause, subject
from fleetlens.simulator import parse_scenario
from fleetlens.simulator.fleet import Fleet
from fleetlens.simulator.metrics import AGENT_SCOPE, ENGINE_METRICS, ENGINE_SCOPE, metrics_data
from fleetlens.simulator.scenario import ScenarioError
from tests.simulator.helpers import Outcome, host_of, simulate
from tests.simulator.test_incidents import END, START, START_NS, baseline, doc, identical_elsewhere

__all__ = ["baseline"]  # the module-scoped fixture of test_incidents, run once here too

S = 1_000_000_000
CRASH_NS, RESTART_NS = START_NS + int(START * S), START_NS + int(END * S)


def run_case(kind: str, gateway_timeout_s: float | None = None, **target) -> Outcome:
    document = doc([{"kind": kind, "start_s": START, "duration_s": END - START, **target}])
    if gateway_timeout_s is not None:
        document["workload"][0]["gateway_timeout_s"] = gateway_timeout_s
    return simulate(document)


def instance_of(span) -> str:
    return span.resource.attributes[a.SERVICE_INSTANCE_ID]


def gateway_errors(o: Outcome, instance: str | None = None) -> dict[int, list]:
    """Failed gateway spans by HTTP status code (of ``instance``, or all)."""
    out: dict[int, list] = {}
    for s in o.spans:
        if s.name == a.GATEWAY_SPAN and s.status.status_code is StatusCode.ERROR and (
                instance is None or s.attributes[a.FLEETLENS_INSTANCE_ID] == instance):
            out.setdefault(s.attributes[a.HTTP_RESPONSE_STATUS_CODE], []).append(s)
    return out


def engine_points(o: Outcome, instance: str, metric: str) -> list[tuple[int, float]]:
    return o.series(metric, **{a.ENGINE_INSTANCE: instance})


def inside(ts: int) -> bool:
    return CRASH_NS < ts <= RESTART_NS


def test_a_run_without_failures_reports_liveness_and_no_error(baseline) -> None:
    assert baseline.result.failed == 0
    assert not [s for s in baseline.spans if s.status.status_code is not StatusCode.UNSET
                or a.HTTP_RESPONSE_STATUS_CODE in s.attributes
                or a.GEN_AI_FINISH_REASONS in s.attributes]
    samples = {ts for _, _, _, _, ts in baseline.points}
    beats = [(h, at, v, ts) for h, n, at, v, ts in baseline.points if n == a.AGENT_HEARTBEAT]
    assert {(h, ts) for h, _, _, ts in beats} == {(h, ts) for h in ("h01", "h02", "h03")
                                                  for ts in samples}
    assert all(at == {} and v == 1 for _, at, v, _ in beats)
    starts = {}
    for iid in ("h01/chat/0", "h01/chat/1", "h02/chat/0", "h02/chat/1", "h03/big"):
        assert {v for _, v in engine_points(baseline, iid, a.ENGINE_UP)} == {1}
        values = {v for _, v in engine_points(baseline, iid, a.ENGINE_START_TIME)}
        assert len(values) == 1
        starts[iid] = values.pop()
        assert START_NS / S - 600 * 60 <= starts[iid] <= START_NS / S - 5 * 60
    assert len(set(starts.values())) == len(starts)  # each process started at its own time


def test_engine_down_refuses_then_engine_restart_is_cold(baseline) -> None:
    out = run_case("engine_down", gpu="h01:0")
    dead = "h01/chat/0"
    # no request of the dead engine started during the crash
    assert not [s for s in out.requests() if instance_of(s) == dead
                and CRASH_NS <= s.start_time < RESTART_NS]
    errors = gateway_errors(out, dead)
    assert set(errors) == {502, 503}
    assert all(s.end_time == CRASH_NS and s.start_time < CRASH_NS for s in errors[502])
    assert all(s.end_time - s.start_time == S // 1000
               and CRASH_NS <= s.start_time < RESTART_NS for s in errors[503])
    assert len(errors[503]) > 300  # a quarter of 14 req/s for 120 s
    for code, spans in errors.items():
        for s in spans:
            assert s.attributes[a.ERROR_TYPE] == str(code)
            assert s.attributes[a.SERVER_ADDRESS] == "h01"
            assert s.attributes[a.GEN_AI_REQUEST_MODEL] == "meta-llama/Llama-3.1-8B-Instruct"
    failed_traces = {s.context.trace_id for spans in errors.values() for s in spans}
    assert not [s for s in out.requests() if s.context.trace_id in failed_traces]
    assert out.result.failed == sum(map(len, errors.values()))  # every request had a gateway
    # the agent: up = 0 and nothing else for that engine while it is dead
    up = engine_points(out, dead, a.ENGINE_UP)
    assert {v for ts, v in up if inside(ts)} == {0}
    assert {v for ts, v in up if not inside(ts)} == {1}
    for name in (a.ENGINE_START_TIME, a.ENGINE_NUM_RUNNING, a.ENGINE_GENERATION_TOKENS,
                 a.ENGINE_INSTANCE_GPUS):
        assert not [ts for ts, _ in engine_points(out, dead, name) if inside(ts)]
    started = engine_points(out, dead, a.ENGINE_START_TIME)
    before = {v for ts, v in started if ts <= CRASH_NS}
    assert before == {v for ts, v in engine_points(baseline, dead, a.ENGINE_START_TIME)}
    assert {v for ts, v in started if ts > RESTART_NS} == {RESTART_NS / S}
    # a new process: counters from 0, GPU memory freed while dead
    tokens = dict(engine_points(out, dead, a.ENGINE_GENERATION_TOKENS))
    assert tokens[RESTART_NS + 10 * S] < tokens[CRASH_NS] / 2
    memory = [v for h, n, at, v, ts in out.points if h == "h01" and n == a.HW_GPU_MEMORY_USAGE
              and at[a.GPU_INDEX] == 0 and inside(ts)]
    assert memory and set(memory) == {0.0}
    # requests come back after the restart
    assert [s for s in out.requests() if instance_of(s) == dead and s.start_time >= RESTART_NS]
    # ground truth: the crash, then the restart on the same engine
    down, restart = out.result.ground_truth["incidents"]
    assert down["cause"] == Cause.ENGINE_DOWN
    assert down["subject"] == restart["subject"] == subject(c.INSTANCE_ID, dead)
    assert restart["cause"] == Cause.ENGINE_RESTART
    assert (restart[c.START_NS], restart[c.END_NS]) == (RESTART_NS, RESTART_NS + 60 * S)
    # the other engine of h01 and every other host see nothing
    def other(o):
        return sorted((s.context.trace_id, s.start_time, s.end_time) for s in o.requests()
                      if instance_of(s) == "h01/chat/1")
    assert other(out) == other(baseline)
    identical_elsewhere(out, baseline, {"h01"})


def test_engine_hang_stalls_and_the_gateway_times_out(baseline) -> None:
    out = run_case("engine_hang", gateway_timeout_s=20.0, gpu="h02:1")
    hung = "h02/chat/1"
    assert {v for _, v in engine_points(out, hung, a.ENGINE_UP)} == {1}
    window = [ts for ts, _ in engine_points(out, hung, a.ENGINE_UP)
              if CRASH_NS + 10 * S < ts <= RESTART_NS]
    running = dict(engine_points(out, hung, a.ENGINE_NUM_RUNNING))
    tokens = dict(engine_points(out, hung, a.ENGINE_GENERATION_TOKENS))
    waiting = dict(engine_points(out, hung, a.ENGINE_NUM_WAITING))
    assert len({running[ts] for ts in window}) == 1 and running[window[0]] > 0
    assert len({tokens[ts] for ts in window}) == 1
    assert all(waiting[x] < waiting[y] for x, y in zip(window, window[1:], strict=False))
    errors = gateway_errors(out)
    assert set(errors) == {504}
    assert all(s.attributes[a.FLEETLENS_INSTANCE_ID] == hung for s in errors[504])
    assert all(s.end_time - s.start_time == 20 * S for s in errors[504])
    assert all(CRASH_NS < s.end_time <= RESTART_NS for s in errors[504])
    assert len(errors[504]) > 200
    # at the end the engine resumes: the requests that waited finish, without a second
    # gateway span
    timed_out = {s.context.trace_id for s in errors[504]}
    resumed = [s for s in out.requests() if s.context.trace_id in timed_out]
    assert len(resumed) == len(timed_out)
    assert all(s.end_time > RESTART_NS for s in resumed)
    gateways = [s for s in out.spans if s.name == a.GATEWAY_SPAN]
    assert len({s.context.trace_id for s in gateways}) == len(gateways)
    (item,) = out.result.ground_truth["incidents"]
    assert (item["cause"], item["subject"]) == (Cause.ENGINE_HANG, subject(c.INSTANCE_ID, hung))
    identical_elsewhere(out, baseline, {"h02"})


def test_request_errors_abort_a_share_after_prefill(baseline) -> None:
    out = run_case("request_errors", service="chat", magnitude=0.3)
    chat = [s for s in out.requests() if host_of(s) != "h03"]
    during = [s for s in chat if CRASH_NS + S <= s.start_time < RESTART_NS]
    aborted = [s for s in chat if a.GEN_AI_FINISH_REASONS in s.attributes]
    assert aborted and all(CRASH_NS <= s.start_time < RESTART_NS + S for s in aborted)
    share = len([s for s in during if s in aborted]) / len(during)
    assert share == pytest.approx(0.3, abs=0.05)
    for s in aborted:
        assert json.loads(s.attributes[a.GEN_AI_FINISH_REASONS]) == ["abort"]
        assert s.status.status_code is StatusCode.ERROR
        assert s.attributes[a.GEN_AI_COMPLETION_TOKENS] == 1  # after its prefill
    assert all(s.status.status_code is StatusCode.UNSET for s in chat if s not in aborted)
    errors = gateway_errors(out)
    assert set(errors) == {500}
    assert {s.context.trace_id for s in errors[500]} == {s.context.trace_id for s in aborted}
    assert all(s.attributes[a.ERROR_TYPE] == "500" for s in errors[500])
    assert out.result.failed == len(aborted)
    (item,) = out.result.ground_truth["incidents"]
    assert item["subject"] == subject(c.SERVICE_NAME, "chat")
    identical_elsewhere(out, baseline, {"h01", "h02"})


def test_host_down_silences_the_agent_and_restarts_every_engine(baseline) -> None:
    out = run_case("host_down", host="h01")
    assert not [p for p in out.points if p[0] == "h01" and inside(p[4])]
    beats = {ts for h, n, _, _, ts in out.points if h == "h01" and n == a.AGENT_HEARTBEAT}
    assert CRASH_NS in beats and RESTART_NS + 10 * S in beats
    for iid in ("h01/chat/0", "h01/chat/1"):
        assert not [s for s in out.requests() if instance_of(s) == iid
                    and CRASH_NS <= s.start_time < RESTART_NS]
        assert set(gateway_errors(out, iid)) == {502, 503}
        after = {v for ts, v in engine_points(out, iid, a.ENGINE_START_TIME) if ts > RESTART_NS}
        assert after == {RESTART_NS / S}
    down, *restarts = out.result.ground_truth["incidents"]
    assert (down["cause"], down["subject"]) == (Cause.HOST_DOWN, subject(c.HOST_NAME, "h01"))
    # the host's engines came back together: one restart of the host, naming both
    assert [(x["cause"], x["subject"], x[c.START_NS], x["instances"]) for x in restarts] == [
        (Cause.ENGINE_RESTART, subject(c.HOST_NAME, "h01"), RESTART_NS,
         ["h01/chat/0", "h01/chat/1"])]
    identical_elsewhere(out, baseline, {"h01"})


def test_telemetry_gap_silences_only_the_agent(baseline) -> None:
    out = run_case("telemetry_gap", host="h02")
    assert not [p for p in out.points if p[0] == "h02" and inside(p[4])]
    # the engines serve as usual: every span is the baseline's
    def spans(o):
        return sorted((s.context.trace_id, s.name, s.start_time, s.end_time,
                       tuple(sorted(s.attributes.items()))) for s in o.spans)
    assert spans(out) == spans(baseline)
    # and outside the window the agent reports what it would have (utilisation included)
    def outside(o):
        return sorted((h, n, tuple(sorted(at.items())), v, ts) for h, n, at, v, ts in o.points
                      if not (h == "h02" and inside(ts)))
    assert outside(out) == outside(baseline)
    (item,) = out.result.ground_truth["incidents"]
    assert item["subject"] == subject(c.HOST_NAME, "h02")


def test_engine_kinds_on_a_host_name_the_host() -> None:
    out = run_case("engine_hang", host="h01", service="chat")
    (item,) = out.result.ground_truth["incidents"]
    assert item["subject"] == subject(c.HOST_NAME, "h01")
    assert item["instances"] == ["h01/chat/0", "h01/chat/1"]
    assert {s.attributes[a.FLEETLENS_INSTANCE_ID] for s in gateway_errors(out)[504]} == {
        "h01/chat/0", "h01/chat/1"}


def _with_spare_host(document: dict) -> dict:
    document["fleet"]["hosts"].append({"name": "h04", "gpus": 1})
    return document


def _with_idle_service(document: dict) -> dict:
    document["fleet"]["hosts"].append({"name": "h04", "gpus": 1})
    document["deployment"].append({"service": "idle", "hosts": ["h04"]})
    return document


@pytest.mark.parametrize("incident,mutate,message", [
    ({"kind": "engine_down", "host": "h04"}, _with_spare_host, "no engine runs on the target"),
    ({"kind": "engine_hang", "host": "h04"}, _with_spare_host, "no engine runs on the target"),
    ({"kind": "engine_down", "service": "chat"}, None, "needs a 'host' (or 'gpu') target"),
    ({"kind": "host_down", "host": "h01", "service": "chat"}, None, "takes a whole host"),
    ({"kind": "telemetry_gap", "gpu": "h01:0"}, None, "takes a whole host"),
    ({"kind": "request_errors", "service": "chat", "magnitude": 1.5}, None, "within (0, 1]"),
    ({"kind": "request_errors", "service": "idle"}, _with_idle_service,
     "no workload sends requests"),
    ({"kind": "request_errors", "host": "h04"}, _with_spare_host, "no engine runs"),
    ({"kind": "gpu_fault", "host": "h01"}, None, "takes exactly one GPU"),
])
def test_a_failure_that_could_not_show_is_refused(incident, mutate, message) -> None:
    document = doc([{"start_s": START, "duration_s": 60, **incident}])
    if mutate is not None:
        document = mutate(document)
    with pytest.raises(ScenarioError) as info:
        Fleet(parse_scenario(document), 1)
    assert message in str(info.value) and "[[incident]] #1" in str(info.value)


def test_metric_units_and_kinds() -> None:
    collection = ("h01", 5, {AGENT_SCOPE: {a.AGENT_HEARTBEAT: [({}, 1)]}, ENGINE_SCOPE: {
        a.ENGINE_UP: [({a.ENGINE_INSTANCE: "i"}, 0)], a.ENGINE_START_TIME: [],
        a.ENGINE_NUM_RUNNING: []}})
    data = metrics_data([collection], {"h01": Resource({})}, 0)
    metrics = {m.name: m for sm in data.resource_metrics[0].scope_metrics for m in sm.metrics}
    assert set(metrics) == {a.AGENT_HEARTBEAT, a.ENGINE_UP}  # no empty metric
    assert all(m.unit == "1" and isinstance(m.data, Gauge) for m in metrics.values())
    assert ENGINE_METRICS[a.ENGINE_START_TIME] == ("s", False)


def test_gateway_failover_moves_a_dead_engines_load_to_its_peers(baseline) -> None:
    document = doc([{"kind": "engine_down", "gpu": "h01:0", "start_s": START,
                     "duration_s": END - START}])
    document["workload"][0].update(gateway_failover=True, gateway_health_delay_s=15.0)
    out = simulate(document)
    refused = gateway_errors(out, "h01/chat/0")[503]
    assert refused and all(s.start_time < CRASH_NS + 15 * S for s in refused)
    assert max(s.start_time for s in refused) > CRASH_NS + 14 * S

    def served(o, iid):
        return len([s for s in o.requests() if instance_of(s) == iid
                    and CRASH_NS + 15 * S <= s.start_time < RESTART_NS])

    peers = ("h01/chat/1", "h02/chat/0", "h02/chat/1")
    moved = sum(served(out, p) - served(baseline, p) for p in peers)
    assert moved > 300  # about a quarter of 14 req/s for 105 s
    assert all(served(out, p) > served(baseline, p) + 60 for p in peers)  # spread over all
    assert served(out, "h01/chat/0") == 0
    # without failover the peers see exactly the baseline's requests
    plain = run_case("engine_down", gpu="h01:0")
    assert all(served(plain, p) == served(baseline, p) for p in peers)
