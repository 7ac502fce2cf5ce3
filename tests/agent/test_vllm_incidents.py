"""Issues 15 and 30, on a real vLLM: a surge, a hang, a crash and a restart with a smaller KV
cache, induced on the CPU vLLM server in one timeline (:mod:`tests.agent.vllm_scenario`),
are found and named by the real ``fleetlens pipeline`` + ``fleetlens analyze`` with 10 s
windows (the other analytics settings are the defaults).

The fixture checks the ground truth first (:mod:`tests.agent.vllm_conditions`); the surge's
is checked by its own test, which skips when this machine could not deliver the surge.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import polars as pl
import pytest

from fleetlens.pipeline.normalize import SOURCE_GATEWAY
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema.causes import subject
from tests.agent.incident_run import NS
from tests.agent.vllm_conditions import check_conditions, check_surge
from tests.agent.vllm_scenario import HOST, INSTANCE, WINDOW_S, Run, diagnosed, run_timeline

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SUBJECT = subject(c.INSTANCE_ID, INSTANCE)
#: The surge is a surge when the server received at least this multiple of the steady
#: arrivals (x5.3 is sent); below it the machine could not deliver the case.
MIN_ARRIVALS_RATIO = 2.0


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Iterator[Run]:
    tmp = tmp_path_factory.mktemp("vllm-incidents")
    started = time.monotonic()
    data, plan, calibration, events, report = run_timeline(tmp)
    ok = len(calibration) + sum(r.ok for r in plan)
    # vLLM's exporter loses the spans it had not sent when SIGKILLed (a 5 s batch at most)
    # and may drop a batch under heavy load (see wait_for_spans)
    assert report["spans_landed"] >= 0.9 * ok, report
    check_conditions(data, plan, events, report)
    result = diagnosed(tmp, data, events, report)
    yield result
    report["total_s"] = round(time.monotonic() - started, 1)
    print("\nvLLM incidents run:", json.dumps(report, default=str))


def _latency_incidents(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.filter(~pl.col(c.DETECTOR).str.starts_with("failure:"))


def _near(frame: pl.DataFrame, at_ns: int, before_s: float, after_s: float) -> pl.DataFrame:
    return frame.filter(pl.col(c.START_NS).is_between(at_ns - int(before_s * NS),
                                                      at_ns + int(after_s * NS)))


def _check(run: Run, span: tuple[int, int], cause: str, *then: str) -> None:
    """A latency incident starts with the case (from two windows before it to its end: one
    that began earlier and runs on is not this case found) and ranks ``cause`` first (and
    ``then`` after it). Failure incidents (a restart's downtime, the change itself) are
    incidents of their own, not this case's."""
    found = run.diagnosis.overlapping(*span).filter(
        (pl.col(c.START_NS) >= span[0] - 2 * WINDOW_S * NS)
        & ~pl.col(c.DETECTOR).str.starts_with("failure:"))
    assert found.height, f"no incident starts with {span}: {run.shown(run.incidents())}"
    first = found.row(0, named=True)
    ranking = run.diagnosis.ranking(first[c.INCIDENT_ID])
    run.report[cause] = {"incidents": run.shown(found), "ranking": ranking,
                         "detected_after_s": (first[c.START_NS] - span[0]) / NS}
    assert first[c.CAUSE] == cause, f"ranked {ranking}"
    assert [x for x, _ in ranking[1:1 + len(then)]] == list(then), f"ranked {ranking}"


def test_a_surge_above_capacity_is_found_and_ranked_traffic_surge(run: Run) -> None:
    check_surge(run.data, run.events, run.report)
    if run.report["arrivals_ratio"] < MIN_ARRIVALS_RATIO:
        load = run.report["load"]
        pytest.skip(f"the surge reached the server as x{run.report['arrivals_ratio']} the "
                    f"steady arrivals (x{load['surge'] / load['steady']:.1f} sent, send lag up to "
                    f"{run.report['max_send_lag_s']} s): this machine could not deliver it")
    _check(run, run.span("surge_start", "surge_end"), "traffic_surge")


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


def test_a_restart_with_a_small_kv_cache_is_ranked_config_change_then_kv_cache_pressure(
        run: Run) -> None:
    # Since issue 30 the restart is a configuration change the agent sees (num_gpu_blocks,
    # kv_cache_memory_bytes in cache_config_info): it was the deploy, then its mechanism.
    ev, all_ = run.events, run.incidents()
    _check(run, run.span("change_ready", "load_end"), "config_change", "kv_cache_pressure")
    slow = _latency_incidents(all_).filter(
        pl.col(c.START_NS).is_between(ev["change_ready"] - 2 * WINDOW_S * NS, ev["load_end"]))
    changes = json.loads(slow[c.EVIDENCE][0])["changes"]
    assert any(line.startswith("kv_cache_memory_bytes ") for line in changes), changes
    change = all_.filter((pl.col(c.CAUSE) == "config_change")
                         & (pl.col(c.DETECTOR) == "failure:config_change"))
    assert change[c.SUBJECT].to_list() == [SUBJECT], run.shown(change)
    assert "num_gpu_blocks" in change[c.SUMMARY][0], run.shown(change)
    # the restart the change came with is part of it (docs/analytics.md), not an incident
    restart = all_.filter((pl.col(c.CAUSE) == "engine_restart") & pl.col(c.START_NS).is_between(
        ev["change"] - WINDOW_S * NS, ev["change_ready"] + WINDOW_S * NS))
    assert restart.is_empty(), run.shown(restart)
