"""Each incident kind produces its symptom on its target, and nothing on the other hosts.

Every case runs the same scenario and seed as the baseline with one incident added; since
routing and arrivals do not depend on load, requests and GPUs elsewhere must be identical.
"""

from __future__ import annotations

import statistics

import pytest

from fleetlens.pipeline.schema import CAUSES, LATENCY_CAUSES
from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema.causes import Cause
from fleetlens.simulator.power import REASON_SW_POWER_CAP, REASON_SW_THERMAL
from fleetlens.simulator.scenario import DEFAULT_MAGNITUDE
from tests.simulator.helpers import Outcome, host_of, simulate, tpot

START, END = 60.0, 180.0
START_NS = 1_767_621_600_000_000_000  # 2026-01-05T14:00:00Z


def doc(incidents: list[dict]) -> dict:
    return {
        "fleet": {"name": "incidents", "start": "2026-01-05T14:00:00Z", "duration_s": 240,
                  "drain_s": 60, "seed": 9,
                  "hosts": [{"prefix": "h", "count": 3, "gpus": 2}]},
        "deployment": [
            {"service": "chat", "model": "llama-3.1-8b", "hosts": ["h01", "h02"],
             "max_num_seqs": 32, "kv_blocks": 4000},
            {"service": "big", "model": "qwen2.5-32b", "hosts": ["h03"], "tp": 2},
        ],
        "workload": [
            {"service": "chat", "rate": 14.0, "gateway_share": 1.0, "prefix_groups": 3,
             "prefix_tokens": 512, "prefix_share": 0.8,
             "prompt": {"median": 900, "sigma": 0.5, "max": 6000},
             "output": {"median": 200, "sigma": 0.5, "max": 1000}},
            {"service": "big", "rate": 2.0},
        ],
        "incident": incidents,
    }


@pytest.fixture(scope="module")
def baseline() -> Outcome:
    return simulate(doc([]))


def in_window(spans, host=None, lag=20.0):
    lo, hi = START_NS + int((START + lag) * 1e9), START_NS + int(END * 1e9)
    return [s for s in spans if lo <= s.start_time < hi and (host is None or host_of(s) == host)]


def identical_elsewhere(case: Outcome, base: Outcome, hosts: set[str]) -> None:
    """Spans and metric points of hosts outside ``hosts`` equal the baseline's."""
    def spans(o):
        return sorted((s.context.trace_id, s.name, s.start_time, s.end_time,
                       tuple(sorted(s.attributes.items())))
                      for s in o.spans if host_of(s) not in hosts
                      and s.attributes.get(a.SERVER_ADDRESS) not in hosts)

    def points(o):
        return sorted((h, n, tuple(sorted(at.items())), v, ts) for h, n, at, v, ts in o.points
                      if h not in hosts)

    assert spans(case) == spans(base)
    assert points(case) == points(base)


def median(values) -> float:
    return statistics.median(list(values))


def gpu_series(o: Outcome, metric: str, host: str, index: int) -> list[float]:
    return [v for h, n, at, v, ts in o.points
            if n == metric and h == host and at.get(a.GPU_INDEX) == index
            and START_NS + (START + 40) * 1e9 <= ts < START_NS + END * 1e9]


def case(kind: str, **target) -> tuple[Outcome, dict]:
    incident = {"kind": kind, "start_s": START, "duration_s": END - START, **target}
    return simulate(doc([incident])), incident


def test_traffic_surge_fills_the_queue(baseline) -> None:
    out, _ = case("traffic_surge", service="chat", magnitude=4.0)
    chat = [s for s in in_window(out.requests()) if host_of(s) != "h03"]
    base = [s for s in in_window(baseline.requests()) if host_of(s) != "h03"]
    assert len(chat) > 3 * len(base)
    queue = a.GEN_AI_TIME_IN_QUEUE
    assert median(s.attributes[queue] for s in chat) > 10 * median(
        s.attributes[queue] for s in base)
    identical_elsewhere(out, baseline, {"h01", "h02"})


def test_kv_cache_pressure_preempts(baseline) -> None:
    out, _ = case("kv_cache_pressure", host="h01", magnitude=0.9)
    pre = out.series(a.ENGINE_PREEMPTIONS, host="h01")
    assert max(v for _, v in pre) > 0
    assert max(v for _, v in baseline.series(a.ENGINE_PREEMPTIONS, host="h01")) == 0
    usage = [v for ts, v in out.series(a.ENGINE_KV_CACHE_USAGE, host="h01")
             if START_NS + START * 1e9 < ts < START_NS + END * 1e9]
    assert min(usage) >= 0.9
    identical_elsewhere(out, baseline, {"h01"})


def test_prefix_cache_drop_stops_hits_and_lengthens_prefill(baseline) -> None:
    out, _ = case("prefix_cache_drop", host="h02")

    def hits(o):
        total = 0
        for instance in ("h02/chat/0", "h02/chat/1"):
            series = o.series(a.ENGINE_PREFIX_CACHE_HITS, **{a.ENGINE_INSTANCE: instance})
            inside = [v for ts, v in series if START_NS + START * 1e9 <= ts <= START_NS + END * 1e9]
            total += inside[-1] - inside[0]
        return total

    assert hits(baseline) > 0 and hits(out) < 0.05 * hits(baseline)
    prefill = a.GEN_AI_PREFILL
    assert median(s.attributes[prefill] for s in in_window(out.requests(), "h02")) > 1.3 * (
        median(s.attributes[prefill] for s in in_window(baseline.requests(), "h02")))
    identical_elsewhere(out, baseline, {"h02"})


def test_long_prompts_lengthen_prompts_and_prefill(baseline) -> None:
    out, _ = case("long_prompts", service="chat", magnitude=4.0)
    chat = [s for s in in_window(out.requests(), lag=0) if host_of(s) != "h03"]
    base = [s for s in in_window(baseline.requests(), lag=0) if host_of(s) != "h03"]
    tokens = a.GEN_AI_PROMPT_TOKENS
    assert median(s.attributes[tokens] for s in chat) > 3 * median(
        s.attributes[tokens] for s in base)
    assert median(s.attributes[a.GEN_AI_PREFILL] for s in chat) > 2 * median(
        s.attributes[a.GEN_AI_PREFILL] for s in base)
    identical_elsewhere(out, baseline, {"h01", "h02"})


def test_thermal_throttle_lowers_the_clock_and_raises_tpot(baseline) -> None:
    out, _ = case("thermal_throttle", gpu="h01:0")
    clocks = gpu_series(out, a.GPU_CLOCK_SM, "h01", 0)
    assert max(clocks) < 0.9 * 1980
    assert all(int(v) & REASON_SW_THERMAL for v in gpu_series(out, a.GPU_CLOCKS_EVENT_REASONS,
                                                                "h01", 0))
    assert min(gpu_series(out, a.HW_TEMPERATURE, "h01", 0)) > 80
    slow = [s for s in in_window(out.requests(), "h01", lag=40)
            if s.resource.attributes[a.SERVICE_INSTANCE_ID] == "h01/chat/0"]
    base = [s for s in in_window(baseline.requests(), "h01", lag=40)
            if s.resource.attributes[a.SERVICE_INSTANCE_ID] == "h01/chat/0"]
    assert median(map(tpot, slow)) > 1.2 * median(map(tpot, base))
    # the other GPU of the same host is untouched
    assert gpu_series(out, a.GPU_CLOCK_SM, "h01", 1) == gpu_series(
        baseline, a.GPU_CLOCK_SM, "h01", 1)
    identical_elsewhere(out, baseline, {"h01"})
    assert out.result.ground_truth["incidents"][0]["subject"].startswith("gpu_uuid=GPU-")


def test_power_cap_holds_power_under_the_limit(baseline) -> None:
    out, _ = case("power_cap", gpu="h01:1", magnitude=0.4)
    assert set(gpu_series(out, a.GPU_POWER_LIMIT, "h01", 1)) == {280.0}
    assert max(gpu_series(out, a.HW_POWER, "h01", 1)) <= 280.0 * 1.05
    assert max(gpu_series(baseline, a.HW_POWER, "h01", 1)) > 300.0
    assert max(gpu_series(out, a.GPU_CLOCK_SM, "h01", 1)) < 0.9 * 1980
    assert all(int(v) & REASON_SW_POWER_CAP
               for v in gpu_series(out, a.GPU_CLOCKS_EVENT_REASONS, "h01", 1))
    identical_elsewhere(out, baseline, {"h01"})


def test_slow_gpu_raises_tpot_at_a_normal_clock(baseline) -> None:
    out, _ = case("slow_gpu", gpu="h02:0", magnitude=0.5)
    assert set(gpu_series(out, a.GPU_CLOCK_SM, "h02", 0)) == {1980.0}
    slow = [s for s in in_window(out.requests(), "h02", lag=0)
            if s.resource.attributes[a.SERVICE_INSTANCE_ID] == "h02/chat/0"]
    base = [s for s in in_window(baseline.requests(), "h02", lag=0)
            if s.resource.attributes[a.SERVICE_INSTANCE_ID] == "h02/chat/0"]
    assert median(map(tpot, slow)) > 1.5 * median(map(tpot, base))
    identical_elsewhere(out, baseline, {"h02"})


def test_network_overhead_shows_between_gateway_and_engine(baseline) -> None:
    out, _ = case("network_overhead", host="h02", magnitude=0.2)

    def gaps(o):
        by_trace = {}
        for s in in_window(o.spans, lag=0):
            by_trace.setdefault(s.context.trace_id, {})[s.name] = s
        return [(p[a.GATEWAY_SPAN].end_time - p[a.GATEWAY_SPAN].start_time
                 - p[a.VLLM_REQUEST_SPAN].end_time + p[a.VLLM_REQUEST_SPAN].start_time) / 1e9
                for p in by_trace.values() if len(p) == 2
                and p[a.GATEWAY_SPAN].attributes[a.SERVER_ADDRESS] == "h02"]

    assert median(gaps(out)) == pytest.approx(0.401, abs=0.002)
    assert median(gaps(baseline)) == pytest.approx(0.001, abs=0.0005)
    # the engine's own phases do not change
    e2e = a.GEN_AI_E2E
    assert median(s.attributes[e2e] for s in in_window(out.requests(), "h02")) == pytest.approx(
        median(s.attributes[e2e] for s in in_window(baseline.requests(), "h02")), rel=0.2)
    identical_elsewhere(out, baseline, {"h02"})


def test_collective_stall_slows_the_tensor_parallel_group(baseline) -> None:
    out, _ = case("collective_stall", host="h03", magnitude=25.0)
    big, base = in_window(out.requests(), "h03"), in_window(baseline.requests(), "h03")
    assert median(map(tpot, big)) > 1.5 * median(map(tpot, base))
    for index in (0, 1):  # both GPUs of the group stall together, still "busy"
        util = gpu_series(out, a.HW_GPU_UTILIZATION, "h03", index)
        assert median(util) >= median(gpu_series(baseline, a.HW_GPU_UTILIZATION, "h03", index))
    identical_elsewhere(out, baseline, {"h03"})


def test_engine_overhead_raises_tpot_and_idles_the_gpu(baseline) -> None:
    out, _ = case("engine_overhead", host="h01", magnitude=0.03)
    assert median(map(tpot, in_window(out.requests(), "h01"))) > 2 * median(
        map(tpot, in_window(baseline.requests(), "h01")))
    assert median(gpu_series(out, a.HW_GPU_UTILIZATION, "h01", 0)) < 0.7 * median(
        gpu_series(baseline, a.HW_GPU_UTILIZATION, "h01", 0))
    identical_elsewhere(out, baseline, {"h01"})


def test_every_cause_is_covered() -> None:
    """Every kind of the vocabulary is simulated and has its test here or, for the failures,
    in test_failures.py or test_gpu_fault_config.py (engine_restart is the ground truth that
    follows a down incident)."""
    from tests.simulator import test_failures, test_gpu_fault_config

    names = [*globals(), *vars(test_failures), *vars(test_gpu_fault_config)]
    tested = {name.split("_", 1)[1] for name in names if name.startswith("test_")}
    simulated = {*DEFAULT_MAGNITUDE, Cause.ENGINE_RESTART}
    assert set(LATENCY_CAUSES) <= simulated
    assert all(any(cause in t for t in tested) for cause in simulated)
    assert set(CAUSES) == simulated


def test_a_tensor_parallel_group_runs_at_its_slowest_gpu(baseline) -> None:
    out, _ = case("thermal_throttle", gpu="h03:0")
    big, base = in_window(out.requests(), "h03", lag=40), in_window(baseline.requests(), "h03",
                                                                     lag=40)
    assert median(map(tpot, big)) > 1.2 * median(map(tpot, base))
    # GPU 1 is not throttled: full clock, but it waits for GPU 0 in every all-reduce
    assert set(gpu_series(out, a.GPU_CLOCK_SM, "h03", 1)) == {1980.0}
    assert max(gpu_series(out, a.GPU_CLOCK_SM, "h03", 0)) < 0.9 * 1980
    assert median(gpu_series(out, a.HW_POWER, "h03", 1)) < median(
        gpu_series(baseline, a.HW_POWER, "h03", 1))
    assert median(gpu_series(out, a.HW_GPU_UTILIZATION, "h03", 1)) >= median(
        gpu_series(baseline, a.HW_GPU_UTILIZATION, "h03", 1))
    identical_elsewhere(out, baseline, {"h03"})


def test_kv_cache_pressure_keeps_the_gpus_working(baseline) -> None:
    """A full cache runs the batch it holds (issue 32): the GPUs of the pressed host stay as
    busy as under normal load, at its clock and about its power, preempting and
    recomputing, with the queue growing. Before, a request longer than the shrunk cache
    stayed at the head of the queue the whole incident: no request ran and every GPU idled
    at 90 W and 345 MHz. (The power is a few % under normal load's, not above it: the cache
    holds 1-2 requests instead of 7-8, and a smaller decode batch does less arithmetic per
    step for the same weight reads; the power follows the work done.)"""
    out, _ = case("kv_cache_pressure", host="h01", magnitude=0.97)
    for index in (0, 1):
        def pressed(metric: str, i: int = index) -> float:
            return median(gpu_series(out, metric, "h01", i))

        def normal(metric: str, i: int = index) -> float:
            return median(gpu_series(baseline, metric, "h01", i))

        assert pressed(a.GPU_CLOCK_SM) >= normal(a.GPU_CLOCK_SM)
        assert pressed(a.HW_GPU_UTILIZATION) >= 0.95 * normal(a.HW_GPU_UTILIZATION)
        assert pressed(a.HW_POWER) >= 0.9 * normal(a.HW_POWER), index
    window = [(ts, v) for ts, v in out.series(a.ENGINE_NUM_RUNNING, host="h01")
              if START_NS + (START + 40) * 1e9 <= ts < START_NS + END * 1e9]
    assert min(v for _, v in window) >= 1  # never an idle engine with requests waiting
    waiting = [v for ts, v in out.series(a.ENGINE_NUM_WAITING, host="h01")
               if START_NS + (START + 40) * 1e9 <= ts < START_NS + END * 1e9]
    assert median(waiting) > 5
    pre = out.series(a.ENGINE_PREEMPTIONS, host="h01")
    assert max(v for _, v in pre) > 0
    identical_elsewhere(out, baseline, {"h01"})
