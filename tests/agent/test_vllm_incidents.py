"""Issue 15, on a real vLLM: incidents induced on the CPU vLLM server are found and ranked by
the real ``fleetlens pipeline`` + ``fleetlens analyze`` with 10 s windows.

One instance, one timeline (one server start and one steady baseline serve both cases):

0. two calibration bursts (three batches of ``--max-num-seqs`` requests at once) size the
   load from what this server serves (:mod:`tests.agent.incident_load`): the answer length
   (392 tokens down to 136, so about 6 req/s are served) and then the rates. The CPU build
   decoded 750 to 5,700 tokens/s on the machines of these runs, so fixed rates were
   either no surge or an overload from the start;
1. steady open-loop Poisson load at 40% of the capacity ``c`` (3 req/s at most, the rate of
   runs 1-5);
2. a traffic surge: twice ``c`` for a minute (16 req/s at most, likewise);
3. the steady load again for 200 s (the backlog of the surge drains in about 100 s);
4. the same instance (same ``service.instance.id``, port and agent) restarted with a much
   smaller KV cache (``--kv-cache-memory-bytes``: one block more than a request, not 1 GiB)
   under the same steady load, at least 200 s after the surge (more than the 180 s
   ``merge_gap_s`` after its drain: two incidents by design).

Compressed time: the rolling baseline judges a series only after ``rolling_min_windows``
(20) windows, so the steady phase is 230 s (23 windows of 10 s), not five minutes. The
analytics settings are the defaults but ``window_s = 10``.

The fixture first checks that each condition really happened on the server (the surge
queued requests beyond the steady load, the small cache preempted and filled), so a failed
diagnosis is the analytics' miss, not the set-up's.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass

import polars as pl
import pytest

from fleetlens.collector.testing import running_collector
from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, scan
from tests.agent.incident_load import PROMPT_WORDS, Load, Shape
from tests.agent.incident_run import (
    NS,
    Diagnosis,
    Phase,
    Timeline,
    diagnose,
    measure_capacity,
    phase_plan,
    running_agent,
    wait_for_spans,
)
from tests.agent.loadgen import Request, prompt_of
from tests.agent.vllm_env import build_tiny_model, ensure_vllm_venv, free_port, running_vllm

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

HOST = "incident-host"
INSTANCE = f"{HOST}/tiny-0"
WINDOW_S = 10
MAX_NUM_SEQS = 8
SERVER_ARGS = ["--max-num-seqs", str(MAX_NUM_SEQS)]
#: vLLM's span exporter: a batch whose Export misses its deadline is dropped whole, and on
#: this shared machine (load average 50-110) Exports took over the default 10 s: 715 of
#: 2,247 spans lost in one run. Smaller batches and a 30 s deadline bound that loss.
EXPORTER_ENV = {"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "128", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "30"}
#: Steady load after the surge: the backlog drains (15-70 s here), then quiet windows; with
#: the restart (30-120 s) the two cases are more than ``merge_gap_s`` (180 s) apart, so they
#: are two incidents by design (how the analytics splits two causes closer together is not
#: what these tests ask).
RECOVERY_S = 200
#: ... and at least this long after the surge ends. As long as the recovery: the restarted
#: server gets the load as soon as it is ready. An idle wait there (150 s of recovery) was
#: a lull in the KV case's attribution baseline, and the same 3 req/s after it read as a
#: x1.6-1.8 traffic surge ranked above the KV pressure (one run of five).
SEPARATION_S = RECOVERY_S


@dataclass
class Run:
    diagnosis: Diagnosis
    surge: tuple[int, int]  # wall-clock ns of the surge minute
    small_kv: tuple[int, int]  # wall-clock ns of the load on the restarted server
    report: dict


def _request(rng: random.Random, shape: Shape):
    return lambda at: Request(at, prompt_of(rng, PROMPT_WORDS), shape.max_tokens)


def _server_args(shape: Shape) -> list[str]:
    return [*SERVER_ARGS, "--max-model-len", str(shape.max_model_len)]


def _size_load(port: int, rng: random.Random, report: dict) -> tuple[Shape, Load, list]:
    """The answer length, then the rates, from two calibration bursts (incident_load)."""
    longest = Shape()
    rate, first = measure_capacity(port, _request(rng, longest), MAX_NUM_SEQS)
    shape = Shape.for_throughput(rate * longest.max_tokens)
    capacity, second = measure_capacity(port, _request(rng, shape), MAX_NUM_SEQS)
    load = Load.of(capacity)
    report["load"] = {"decode_tokens_per_s": round(rate * longest.max_tokens),
                      "max_tokens": shape.max_tokens, **load.__dict__}
    if not load.judged:
        pytest.skip(f"this machine's vLLM server served {capacity:.2f} req/s of "
                    f"{shape.max_tokens}-token answers: a steady load of 40% of it gives "
                    "too few requests a 10 s window to judge")
    return shape, load, first + second


def _engine(data: DataDir, name: str, lo: int, hi: int) -> pl.Series:
    points = (scan(data, t.METRIC_POINTS).filter(
        (pl.col(c.METRIC_NAME) == name) & pl.col(c.TS_NS).is_between(lo, hi)).collect())
    return points[c.VALUE]


def _arrivals_per_s(data: DataDir, lo: int, hi: int) -> float:
    """Requests the server received per second in [lo, hi] (its spans' start times)."""
    spans = scan(data, t.SPANS).filter(
        (pl.col(c.NAME) == a.VLLM_REQUEST_SPAN) & pl.col(c.START_NS).is_between(lo, hi))
    return spans.select(pl.len()).collect().item() / ((hi - lo) / NS)


def _queue_s(data: DataDir, lo: int, hi: int) -> float:
    spans = scan(data, t.SPANS).filter(
        (pl.col(c.NAME) == a.VLLM_REQUEST_SPAN) & pl.col(c.START_NS).is_between(lo, hi))
    return spans.select(pl.col(c.GEN_AI_TIME_IN_QUEUE_S).mean()).collect().item()


def _send_or_skip(timeline: Timeline, port: int, plan: list[Request], load: Load) -> None:
    """Send ``plan``; skip when the server fell far below its calibrated capacity.

    The rates are sized from the capacity measured at the start, but this machine is shared:
    a server slowed by other work after the calibration (a clean-clone CI run on 2026-12-02
    served about 2 req/s where runs 1-5 had 9-15) lets its queue grow until a request
    waits past the load generator's 600 s. Such a run cannot deliver the cases."""
    try:
        timeline.send(port, plan)
    except TimeoutError:
        pytest.skip(f"a request waited over 600 s for this machine's vLLM server: it served "
                    f"fewer than the steady {load.steady:.2f} req/s (40% of the "
                    f"{load.capacity} req/s it served when calibrated), so the cases "
                    "(a steady baseline, then a surge above it) cannot be delivered here")


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Iterator[Run]:
    python = ensure_vllm_venv()
    tmp = tmp_path_factory.mktemp("incidents")
    model = build_tiny_model(python, tmp / "tiny")
    data = DataDir(tmp / "data")
    rng = random.Random(15)
    report: dict = {}
    resource = {a.SERVICE_INSTANCE_ID: INSTANCE, a.HOST_NAME: HOST}
    port = free_port()
    started = time.monotonic()
    with running_collector(data.root, config={"flush_interval_s": 1.0}) as col:
        server = dict(python=python, model=model, log_path=tmp / "vllm.log", port=port,
                      otlp_endpoint=col.grpc_address, service_name="vllm-tiny",
                      resource_attributes=resource, extra_env=EXPORTER_ENV)
        with running_agent(tmp, col.grpc_address, f"http://127.0.0.1:{port}", INSTANCE, HOST):
            with running_vllm(**server, args=_server_args(Shape())):
                shape, load, calibration = _size_load(port, rng, report)
                before, first = phase_plan(rng, [
                    Phase("steady", load.steady, 230), Phase("surge", load.surge, 60),
                    Phase("recovery", load.steady, RECOVERY_S)], _request(rng, shape))
                after, second = phase_plan(rng, [Phase("small_kv", load.steady, 70)],
                                           _request(rng, shape))
                _send_or_skip(first, port, before, load)
                landed = wait_for_spans(data, len(calibration) + len(before))
            report["first_server_s"] = round(time.monotonic() - started, 1)
            with running_vllm(**server, kv_cache_space_gib=None,
                              args=[*_server_args(shape), "--kv-cache-memory-bytes",
                                    str(shape.small_kv_bytes)]):
                surge_end = first.spans["surge"][1] / NS
                report["surge_end_to_restart_ready_s"] = round(time.time() - surge_end, 1)
                time.sleep(max(0.0, surge_end + SEPARATION_S - time.time()))
                _send_or_skip(second, port, after, load)
                sent = len(calibration) + len(before) + len(after)
                landed = wait_for_spans(data, sent)
                time.sleep(2.0)  # the agent's last scrapes of the small cache
    report["load_and_servers_s"] = round(time.monotonic() - started, 1)
    assert all(r.status == 200 for r in before + after)
    # vLLM's exporter may drop a batch under heavy load (see wait_for_spans): a few at most
    report["spans_lost_by_vllm"] = sent - landed
    assert landed >= 0.97 * sent, report
    (tmp / "timeline.json").write_text(json.dumps(
        {"surge": first.spans, "small_kv": second.spans}))  # for re-analysing the data dir
    report["max_send_lag_s"] = round(max(r.lag_s for r in before + after), 3)
    check_conditions(data, first, second, report)
    t0 = time.monotonic()
    diagnosis = diagnose(data, tmp, WINDOW_S)
    report["diagnose_s"] = round(time.monotonic() - t0, 1)
    print("\n" + diagnosis.printed)
    yield Run(diagnosis, first.spans["surge"], second.spans["small_kv"], report)
    print("\nvLLM incidents run:", json.dumps(report, default=str))


def check_conditions(data: DataDir, first: Timeline, second: Timeline, report: dict) -> None:
    """The induced conditions happened on the server (ground truth from its own telemetry)."""
    steady, surge = first.spans["steady"], first.spans["surge"]
    small = second.spans["small_kv"]
    report["queue_mean_s"] = {name: round(_queue_s(data, *span), 3) for name, span in
                              (("steady", steady), ("surge", surge), ("small_kv", small))}
    # What the server received, not what was sent: a starved machine delays the sender
    # and vLLM's API server alike (one run here at load 13-14 turned x5.3 sent into x1.3).
    report["arrivals_ratio"] = round(_arrivals_per_s(data, *surge)
                                     / max(_arrivals_per_s(data, *steady), 1e-9), 2)
    report["waiting_max"] = {
        name: _engine(data, a.ENGINE_NUM_WAITING, *span).max() for name, span in
        (("steady", steady), ("surge", surge), ("small_kv", small))}
    # Above capacity: requests waited for the engine, far longer than under the steady load.
    assert report["waiting_max"]["surge"] > 4
    assert report["queue_mean_s"]["surge"] > 5 * max(report["queue_mean_s"]["steady"], 0.01)
    preempted = _engine(data, a.ENGINE_PREEMPTIONS, small[0], small[1] + 5 * NS)
    usage = _engine(data, a.ENGINE_KV_CACHE_USAGE, *small)
    report["small_kv"] = {"preemptions": preempted.max(), "kv_usage_max": usage.max(),
                          "kv_usage_max_before": _engine(data, a.ENGINE_KV_CACHE_USAGE,
                                                         *steady).max()}
    assert preempted.max() > 0 and usage.max() > 0.9


def _check(run: Run, span: tuple[int, int], cause: str, *then: str) -> None:
    """A latency incident starts with the case (from two windows before it to its end: one
    that began earlier and runs on is not this case found) and ranks ``cause`` first (and
    ``then`` after it). Failure incidents (a restart's downtime, the change itself) are
    incidents of their own, not this case's."""
    found = run.diagnosis.overlapping(*span).filter(
        (pl.col(c.START_NS) >= span[0] - 2 * WINDOW_S * NS)
        & ~pl.col(c.DETECTOR).str.starts_with("failure:"))
    shown = found.select(c.START_NS, c.END_NS, c.HOST_NAME, c.METRIC, c.CAUSE, c.SUBJECT)
    assert found.height, f"no incident starts with {span}: {run.diagnosis.incidents}"
    first = found.row(0, named=True)
    ranking = run.diagnosis.ranking(first[c.INCIDENT_ID])
    run.report[cause] = {"incidents": shown.to_dicts(), "ranking": ranking,
                         "detected_after_s": (first[c.START_NS] - span[0]) / NS}
    assert first[c.CAUSE] == cause, f"ranked {ranking}"
    assert [x for x, _ in ranking[1:1 + len(then)]] == list(then), f"ranked {ranking}"


#: The surge is a surge when the server received at least this multiple of the steady
#: arrivals (x5.3 is sent); below it the machine could not deliver the case.
MIN_ARRIVALS_RATIO = 2.0


def test_a_surge_above_capacity_is_found_and_ranked_traffic_surge(run: Run) -> None:
    load = run.report["load"]
    if run.report["arrivals_ratio"] < MIN_ARRIVALS_RATIO:
        pytest.skip(f"the surge reached the server as x{run.report['arrivals_ratio']} the "
                    f"steady arrivals (x{load['surge'] / load['steady']:.1f} sent, send lag up to "
                    f"{run.report['max_send_lag_s']} s): this machine could not deliver it")
    _check(run, run.surge, "traffic_surge")


def test_a_restart_with_a_small_kv_cache_is_ranked_config_change_then_kv_cache_pressure(
        run: Run) -> None:
    # Was xfail (non-strict) until session 13: runs 3 and 7 ranked the KV case second
    # (a restart and an idle wait in its baseline read as a surge, fixed in a309e09; a
    # host without GPU telemetry read as a slow GPU, fixed in 0d3a5d1) and run 9 did not
    # find it (too few requests a window, fixed by sizing the load, 6c03a62). With the
    # load sized from the server, runs 10 and 11 ranked kv_cache_pressure first, 1.00.
    # Since issue 30 the restart is a configuration change the agent sees (num_gpu_blocks,
    # kv_cache_memory_bytes in cache_config_info): it was the deploy, then its mechanism.
    _check(run, run.small_kv, "config_change", "kv_cache_pressure")
    changes = run.diagnosis.overlapping(*run.small_kv).filter(
        pl.col(c.DETECTOR) == "failure:config_change")
    assert changes.height == 1 and "num_gpu_blocks" in changes[c.SUMMARY][0], changes
