"""Issue 30, on a real vLLM: failures and changes induced on the CPU vLLM server are found and
named by the real ``fleetlens pipeline`` + ``fleetlens analyze`` with 10 s windows.

One instance (same ``service.instance.id``, port and agent throughout) and one timeline,
under the steady open-loop load of ``test_vllm_incidents.py`` (40% of the capacity that two
calibration bursts measured), a third of it through a real gateway
(:mod:`tests.agent.gateway`, OTel-instrumented, its ``traceparent`` propagated to vLLM):

0. calibration, then :data:`BASELINE_S` of steady load: the rolling baseline judges a
   series only after ``rolling_min_windows`` (20) windows, so the wake-up burst of case 2
   and the slowdown of case 3 can be latency incidents at all;
1. hang: every process of the server SIGSTOPped for :data:`OUTAGE_S`, then SIGCONTed (the
   requests sent meanwhile wait in the kernel and reach vLLM at once when it wakes);
2. crash: :data:`DRAIN_S` later, every process SIGKILLed under load; the same command
   started again on the same port :data:`OUTAGE_S` after the kill (a new process start
   time, the same configuration). Meanwhile the gateway answers 502;
3. change: :data:`CHANGE_AFTER_HANG_S` after the hang ended (so that its latency incident
   and the wake-up's are more than ``merge_gap_s``, 180 s, apart: two incidents by design),
   the server restarted with a much smaller KV cache, under the same load for
   :data:`CHANGED_LOAD_S`.

Case 3's flag: the issue suggests ``--max-num-seqs 1``, but vLLM 0.32 shows it nowhere the
agent's fingerprint reads: ``vllm:cache_config_info`` carries the CacheConfig fields only
(block_size, kv_cache_memory_bytes, num_gpu_blocks, ...; ``max_num_seqs`` is the scheduler's),
``/v1/models`` only ``max_model_len`` and ``/version`` the version. A restart with
``--max-num-seqs 1`` is therefore a plain ``engine_restart`` to fleetlens. The test slows
the server with ``--kv-cache-memory-bytes`` instead, which ``cache_config_info`` shows: the
smallest cache that holds one request of the run's sized length (its ``--max-model-len``,
one block more), as ``test_vllm_incidents.py``'s second case, so requests run about one at
a time, preempted as they grow. When the sized requests are shorter than the calibration's,
``--max-model-len`` changes with it (``/v1/models``: the diff's ``tiny 512 -> 256`` line).

The fixture checks that each condition really happened (the processes were SIGSTOPped /
killed, in ``/proc``; requests failed at the client and at the gateway during the crash; the
agent's scrapes timed out during the hang; the new server runs with the new flag and was
slower), so a failed diagnosis is the analytics' miss, not the set-up's. Analytics settings:
the defaults but ``window_s = 10`` (as ``test_vllm_incidents.py``: compressed time).
"""

from __future__ import annotations

import contextlib
import json
import random
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
import pytest

from fleetlens.collector.testing import running_collector
from fleetlens.pipeline.normalize import SOURCE_GATEWAY
from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.schema.causes import subject
from fleetlens.pipeline.storage import DataDir, scan
from tests.agent.failure_run import BackgroundLoad, Routed, frozen, kill_tree
from tests.agent.gateway import running_gateway
from tests.agent.incident_load import Shape
from tests.agent.incident_run import NS, Diagnosis, diagnose, running_agent, wait_for_spans
from tests.agent.loadgen import poisson
from tests.agent.test_vllm_incidents import EXPORTER_ENV, _request, _server_args, _size_load
from tests.agent.vllm_env import build_tiny_model, ensure_vllm_venv, free_port, running_vllm

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

HOST = "failure-host"
INSTANCE = f"{HOST}/tiny-0"
SUBJECT = subject(c.INSTANCE_ID, INSTANCE)
WINDOW_S = 10
#: each outage: the hang, and the crash until the server is started again
OUTAGE_S = 60
#: steady load before the hang (with the calibration's windows: 20 windows and more)
BASELINE_S = 190
#: from the hang's end to the kill: the wake-up backlog drains (20-40 s at 40% load)
DRAIN_S = 50
#: from the hang's end to the restart with the new configuration: the wake-up incident and
#: the change's are more than merge_gap_s (180 s) apart even with a 40 s drain
CHANGE_AFTER_HANG_S = 195
#: load on the changed server (from when it is ready), then at most CHANGED_DRAIN_S for the
#: requests it queued before it is stopped (its queue grows: the load is above its capacity)
CHANGED_LOAD_S, CHANGED_DRAIN_S = 70.0, 45.0
#: share of the load sent through the gateway
GATEWAY_SHARE = 1 / 3


@dataclass
class Run:
    diagnosis: Diagnosis
    requests: pl.DataFrame  # the pipeline's `requests`
    events: dict[str, int]  # event -> wall-clock ns
    report: dict = field(default_factory=dict)

    def incidents(self) -> pl.DataFrame:
        """Every incident with its rank-1 cause, subject and evidence, earliest first."""
        top = self.diagnosis.causes.filter(pl.col(c.RANK) == 1).select(
            c.INCIDENT_ID, c.CAUSE, c.SUBJECT, c.EVIDENCE)
        return self.diagnosis.incidents.join(top, on=c.INCIDENT_ID, how="left").sort(
            c.START_NS)

    def shown(self, frame: pl.DataFrame) -> list[dict]:
        """Rows for messages: times as seconds after the load started."""
        zero = self.events["load_start"]
        return [{"start_s": round((r[c.START_NS] - zero) / NS, 1),
                 "end_s": round((r[c.END_NS] - zero) / NS, 1), "detector": r[c.DETECTOR],
                 "metric": r[c.METRIC], "cause": r[c.CAUSE], "subject": r[c.SUBJECT],
                 "ranking": self.diagnosis.ranking(r[c.INCIDENT_ID])}
                for r in frame.iter_rows(named=True)]


def _latency_incidents(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.filter(~pl.col(c.DETECTOR).str.starts_with("failure:"))


def _cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Iterator[Run]:
    python = ensure_vllm_venv()
    tmp = tmp_path_factory.mktemp("failures")
    model = build_tiny_model(python, tmp / "tiny")
    data = DataDir(tmp / "data")
    rng = random.Random(30)
    report: dict = {}
    events: dict[str, int] = {}
    port, gateway_port = free_port(), free_port()
    base_args = _server_args(Shape())  # the restart after the crash: the very same command
    started = time.monotonic()
    with contextlib.ExitStack() as outer:
        col = outer.enter_context(running_collector(data.root,
                                                    config={"flush_interval_s": 1.0}))
        server = dict(python=python, model=model, log_path=tmp / "vllm.log", port=port,
                      otlp_endpoint=col.grpc_address, service_name="vllm-tiny",
                      resource_attributes={a.SERVICE_INSTANCE_ID: INSTANCE, a.HOST_NAME: HOST},
                      extra_env=EXPORTER_ENV)
        outer.enter_context(running_gateway(
            tmp / "gateway.log", port=gateway_port, upstream_port=port, server_address=HOST,
            instance_id=INSTANCE, otlp_endpoint=col.grpc_address))

        def start(**kwargs) -> tuple:
            stack = contextlib.ExitStack()
            outer.callback(stack.close)  # stopped by PID however the test ends
            return stack.enter_context(running_vllm(**server, **kwargs)), stack

        first, first_stack = start(args=base_args)
        report["server_start_s"] = round(time.monotonic() - started, 1)
        # The agent from the first server's start to the last one's stop: a server still
        # loading (99 s in run 1, on a machine at load 19) is not the crash this test makes.
        agent = contextlib.ExitStack()
        outer.callback(agent.close)
        agent.enter_context(running_agent(tmp, col.grpc_address, f"http://127.0.0.1:{port}",
                                          INSTANCE, HOST))
        shape, load, calibration = _size_load(port, rng, report)
        make = _request(rng, shape)
        # enough for restarts of 3 minutes; what is left unsent at the end is dropped
        plan_s = BASELINE_S + OUTAGE_S + CHANGE_AFTER_HANG_S + 180 + CHANGED_LOAD_S
        plan = [Routed(make(at), *((gateway_port, True) if rng.random() < GATEWAY_SHARE
                                   else (port, False)))
                for at in poisson(rng, load.steady, 0.0, plan_s)]
        loaded = BackgroundLoad(plan)
        outer.enter_context(loaded)
        events["load_start"] = loaded.started_ns

        def now(name: str) -> None:
            events[name] = time.time_ns()
            report.setdefault("events_s", {})[name] = round(loaded.offset_s(), 1)

        # 1. hang
        loaded.sleep_until(BASELINE_S)
        with frozen(first) as stopped:
            now("hang_start")
            report["stopped_pids"] = sorted(stopped)
            time.sleep(OUTAGE_S)
        now("hang_end")
        hang_end_s = loaded.offset_s()
        # 2. crash, and the same command again on the same port a minute later
        loaded.sleep_until(hang_end_s + DRAIN_S)
        killed = kill_tree(first)
        now("kill")
        report["killed_pids"] = sorted(killed)
        report["killed_returncode"] = first.process.returncode
        first_stack.close()
        loaded.sleep_until(report["events_s"]["kill"] + OUTAGE_S)
        now("restart")
        second, second_stack = start(args=base_args)
        now("restart_ready")
        assert second.process.pid not in killed
        # 3. a restart with the smallest cache that holds one of this run's requests (sized
        # for Shape() instead, run 2's 2-block requests fitted two at a time: not slower)
        loaded.sleep_until(hang_end_s + CHANGE_AFTER_HANG_S)
        now("change")
        second_stack.close()
        small_kv = shape.small_kv_bytes
        third, third_stack = start(kv_cache_space_gib=None, args=[
            *_server_args(shape), "--kv-cache-memory-bytes", str(small_kv)])
        now("change_ready")
        flag = ["--kv-cache-memory-bytes", str(small_kv)]
        argv = _cmdline(third.process.pid)
        assert any(argv[i:i + 2] == flag for i in range(len(argv))), argv
        assert f'kv_cache_memory_bytes="{small_kv}"' in third.metrics_text()
        loaded.sleep_until(report["events_s"]["change_ready"] + CHANGED_LOAD_S)
        loaded.stop_sending()
        now("load_end")
        loaded.join(CHANGED_DRAIN_S)
        agent.close()
        third_stack.close()  # what the slowed server still queued fails at the client
        loaded.join()
        ok = [*calibration, *(r.request for r in plan if r.ok)]
        report["requests"] = {"sent": sum(r.sent for r in plan), "ok": len(ok),
                              "calibration": len(calibration)}
        landed = wait_for_spans(data, len(ok), settle_s=10.0)
    report["load_and_servers_s"] = round(time.monotonic() - started, 1)
    # vLLM's exporter loses the spans it had not sent when SIGKILLed (a 5 s batch at most)
    report["spans_landed"] = landed
    assert landed >= 0.9 * len(ok), report
    check_conditions(data, plan, events, report)
    (tmp / "events.json").write_text(json.dumps(events))  # for re-analysing the data dir
    t0 = time.monotonic()
    diagnosis = diagnose(data, tmp, WINDOW_S)
    report["diagnose_s"] = round(time.monotonic() - t0, 1)
    requests = scan(data, t.REQUESTS).collect()
    print("\n" + diagnosis.printed)
    result = Run(diagnosis, requests, events, report)
    report["incidents"] = result.shown(result.incidents())
    yield result
    report["total_s"] = round(time.monotonic() - started, 1)
    print("\nvLLM failures run:", json.dumps(report, default=str))


def _during(plan: list[Routed], events: dict[str, int], lo: str, hi: str,
            gateway: bool) -> list[Routed]:
    """Requests of ``plan`` sent between events ``lo`` and ``hi``, by one route."""
    zero = events["load_start"]
    lo_s, hi_s = (events[lo] - zero) / NS, (events[hi] - zero) / NS
    return [r for r in plan if r.sent and r.via_gateway == gateway
            and lo_s <= r.request.sent_at < hi_s]


def check_conditions(data: DataDir, plan: list[Routed], events: dict[str, int],
                     report: dict) -> None:
    """The induced conditions happened (the processes' own states were checked as they
    were signalled; here what the clients, the gateway and the agent saw)."""
    # the crash: refused at the client, 502 from the gateway
    direct = _during(plan, events, "kill", "restart_ready", gateway=False)
    via = _during(plan, events, "kill", "restart_ready", gateway=True)
    report["crash"] = {
        "direct_sent": len(direct), "direct_failed": sum(r.error is not None for r in direct),
        "errors": sorted({r.error for r in direct if r.error}),
        "gateway_sent": len(via), "gateway_502": sum(r.request.status == 502 for r in via)}
    assert report["crash"]["direct_failed"] >= 0.9 * len(direct) > 0, report["crash"]
    assert report["crash"]["gateway_502"] >= 0.9 * len(via) > 0, report["crash"]
    # the hang: requests sent during it were answered after it, the agent's scrapes timed out
    hung = _during(plan, events, "hang_start", "hang_end", gateway=False)
    zero = events["load_start"]
    end_s = (events["hang_end"] - zero) / NS
    # (the kill may cut the wake-up's drain short on a slow machine: half at least)
    report["hang"] = {"sent": len(hung), "ok": sum(r.ok for r in hung),
                      "answered_during_it": sum(r.ok and r.done_s < end_s for r in hung),
                      "answered_after_it": sum(r.ok and r.done_s >= end_s for r in hung)}
    assert report["hang"]["answered_during_it"] == 0, report["hang"]
    assert report["hang"]["answered_after_it"] >= 0.5 * len(hung) > 0, report["hang"]
    samples = scan(data, t.METRIC_POINTS).filter(
        (pl.col(c.METRIC_NAME) == a.ENGINE_UNRESPONSIVE)
        & pl.col(c.TS_NS).is_between(events["hang_start"], events["hang_end"])).collect()
    report["hang"]["unresponsive_scrapes"] = int(samples[c.VALUE].sum())
    assert report["hang"]["unresponsive_scrapes"] > 0, report["hang"]
    # the change: slower than before (client-side latency of the answered requests)
    baseline = _during(plan, events, "load_start", "hang_start", gateway=False)
    changed = _during(plan, events, "change_ready", "load_end", gateway=False)
    before = statistics.median(r.request.latency_s for r in baseline if r.ok)
    after = [r.request.latency_s for r in changed if r.ok]
    report["change"] = {"latency_median_before_s": round(before, 2),
                        "latency_median_after_s": round(statistics.median(after), 2),
                        "answered": len(after), "sent": len(changed)}
    assert statistics.median(after) > 2 * before, report["change"]


def _near(frame: pl.DataFrame, at_ns: int, before_s: float, after_s: float) -> pl.DataFrame:
    return frame.filter(pl.col(c.START_NS).is_between(at_ns - int(before_s * NS),
                                                      at_ns + int(after_s * NS)))


def test_a_killed_server_is_down_then_restarted_on_its_instance(run: Run) -> None:
    ev, all_ = run.events, run.incidents()
    mine = all_.filter(pl.col(c.SUBJECT) == SUBJECT)
    down = _near(mine.filter(pl.col(c.CAUSE) == "engine_down"), ev["kill"], WINDOW_S, WINDOW_S)
    run.report["kill_found"] = run.shown(down)
    assert down.height, f"no engine_down within {WINDOW_S} s of the kill: {run.shown(all_)}"
    restart = mine.filter((pl.col(c.CAUSE) == "engine_restart")
                          & (pl.col(c.START_NS) > down[c.START_NS][0])
                          & (pl.col(c.START_NS) <= ev["restart_ready"] + WINDOW_S * NS))
    assert restart.height, f"no engine_restart after the engine_down: {run.shown(all_)}"


def test_the_gateway_records_the_requests_that_failed_during_the_crash(run: Run) -> None:
    ev = run.events
    failed = run.requests.filter(
        (pl.col(c.SOURCE) == SOURCE_GATEWAY) & pl.col(c.IS_ERROR)
        & pl.col(c.ARRIVAL_NS).is_between(ev["kill"] - NS, ev["restart_ready"]))
    run.report["gateway_failed_requests"] = {
        "rows": failed.height, "instances": failed[c.INSTANCE_ID].unique().to_list(),
        "hosts": failed[c.HOST_NAME].unique().to_list()}
    assert failed.height >= 0.9 * run.report["crash"]["gateway_502"], run.report
    assert failed[c.INSTANCE_ID].unique().to_list() == [INSTANCE]
    assert failed[c.HOST_NAME].unique().to_list() == [HOST]
    # the gateway's traceparent reached vLLM: its answered requests' spans are children
    answered = run.requests.filter(pl.col(c.NETWORK_S).is_not_null())
    assert answered.height > 0


def test_a_stopped_server_is_a_hang_and_its_wake_up_names_it(run: Run) -> None:
    ev, all_ = run.events, run.incidents()
    mine = all_.filter(pl.col(c.SUBJECT) == SUBJECT)
    hang = _near(mine.filter(pl.col(c.CAUSE) == "engine_hang"), ev["hang_start"],
                 WINDOW_S, WINDOW_S)
    run.report["hang_found"] = run.shown(hang)
    assert hang.height, f"no engine_hang at the SIGSTOP: {run.shown(all_)}"
    down = mine.filter((pl.col(c.CAUSE) == "engine_down") & (pl.col(c.START_NS) < ev["hang_end"])
                       & (pl.col(c.END_NS) > ev["hang_start"]))
    assert down.is_empty(), f"the hang read as a crash: {run.shown(down)}"
    wake = _latency_incidents(all_).filter(
        pl.col(c.START_NS).is_between(ev["hang_start"], ev["kill"]))
    run.report["wake_up_incidents"] = run.shown(wake)
    for row in wake.iter_rows(named=True):  # the cascade: the burst names the hang
        assert row[c.CAUSE] == "engine_hang", run.shown(wake)


def test_a_restart_with_a_smaller_kv_cache_is_a_config_change_ranked_first(run: Run) -> None:
    ev, all_ = run.events, run.incidents()
    slow = _latency_incidents(all_).filter(
        pl.col(c.START_NS).is_between(ev["change_ready"] - 2 * WINDOW_S * NS, ev["load_end"]))
    run.report["change_found"] = run.shown(slow)
    assert slow.height, f"no latency incident after the change: {run.shown(all_)}"
    first = slow.row(0, named=True)
    assert first[c.CAUSE] == "config_change", run.shown(slow)
    changes = json.loads(first[c.EVIDENCE])["changes"]
    assert any(line.startswith("kv_cache_memory_bytes ") for line in changes), changes
    change = all_.filter((pl.col(c.CAUSE) == "config_change")
                         & (pl.col(c.DETECTOR) == "failure:config_change"))
    assert change[c.SUBJECT].to_list() == [SUBJECT], run.shown(change)
    # the restart the change came with is part of it (docs/analytics.md), not an incident
    restart = all_.filter((pl.col(c.CAUSE) == "engine_restart") & pl.col(c.START_NS).is_between(
        ev["change"] - WINDOW_S * NS, ev["change_ready"] + WINDOW_S * NS))
    assert restart.is_empty(), run.shown(restart)
