"""The real path with a real vLLM server (CPU build in its own venv), a real fleetlens collector
and the real agent process: spans and engine metrics land in raw Parquet and agree with vLLM's
own /metrics.

The vLLM venv is built by the test set-up when missing (``tests/agent/vllm_env.py``); if it
cannot be built the tests fail (fixture error), they never skip.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

from fleetlens.collector.agent.prometheus import parse_samples
from fleetlens.collector.testing import running_collector
from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.storage import DataDir, scan
from tests.agent import loadgen
from tests.agent.loadgen import Request, new_traceparent, prompt_of
from tests.agent.vllm_env import build_tiny_model, ensure_vllm_venv, running_vllm, stop_tree
from tests.conftest import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

HOST = "e2e-host"
PHASES = {  # span column -> vLLM histogram
    c.GEN_AI_TIME_IN_QUEUE_S: a.VLLM_HISTOGRAMS["queue"],
    c.GEN_AI_PREFILL_S: a.VLLM_HISTOGRAMS["prefill"],
    c.GEN_AI_DECODE_S: a.VLLM_HISTOGRAMS["decode"],
    c.GEN_AI_INFERENCE_S: a.VLLM_HISTOGRAMS["inference"],
    c.GEN_AI_TTFT_S: a.VLLM_HISTOGRAMS["ttft"],
    c.GEN_AI_E2E_S: a.VLLM_HISTOGRAMS["e2e"],
}
PROMPT_COUNTER = a.VLLM_PROMETHEUS_NAMES[a.ENGINE_PROMPT_TOKENS][0]
GENERATION_COUNTER = a.VLLM_PROMETHEUS_NAMES[a.ENGINE_GENERATION_TOKENS][0]
PREEMPTION_COUNTER = a.VLLM_PROMETHEUS_NAMES[a.ENGINE_PREEMPTIONS][0]


@pytest.fixture(scope="module")
def vllm_python() -> Path:
    return ensure_vllm_venv()


@pytest.fixture(scope="module")
def tiny_model(vllm_python: Path, tmp_path_factory) -> Path:
    return build_tiny_model(vllm_python, tmp_path_factory.mktemp("model") / "tiny")


def totals(text: str) -> dict[str, float]:
    """Every sample summed over labels, by sample name (histogram _sum/_count included)."""
    out: dict[str, float] = defaultdict(float)
    for sample in parse_samples(text):
        out[sample.name] += sample.value
    return out


@contextlib.contextmanager
def running_agent(tmp: Path, collector: str, vllm_url: str, instance: str
                  ) -> Iterator[subprocess.Popen]:
    config = tmp / "agent.toml"
    config.write_text(f"""
[agent]
collector = "{collector}"
fake_gpus = 1
host_name = "{HOST}"
scrape_interval_s = 0.2
export_interval_s = 0.5
[[agent.vllm]]
url = "{vllm_url}"
instance_id = "{instance}"
gpus = ["0"]
""")
    log = open(tmp / f"agent-{instance.replace('/', '_')}.log", "wb")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETLENS_")}
    proc = subprocess.Popen([sys.executable, "-m", "fleetlens", "agent", "--config", str(config)],
                            cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        yield proc
    finally:
        stop_tree(proc)
        log.close()
    assert proc.returncode == 0, (tmp / log.name).read_text()


def wait_for_spans(data: DataDir, count: int, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        spans = scan(data, "spans").filter(pl.col(c.NAME) == a.VLLM_REQUEST_SPAN)
        if spans.select(pl.len()).collect().item() >= count:
            return
        time.sleep(0.5)
    raise AssertionError(f"fewer than {count} llm_request spans after {timeout_s} s")


def wait_for_agent(data: DataDir, timeout_s: float = 90.0) -> None:
    """Until the agent's first scrapes (idle engine) have landed in raw Parquet."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        points = scan(data, "metric_points").filter(
            pl.col(c.METRIC_NAME) == a.ENGINE_NUM_RUNNING)
        if points.select(pl.len()).collect().item() >= 2:
            return
        time.sleep(0.3)
    raise AssertionError(f"no engine metrics from the agent after {timeout_s} s")


def spans_by_request(data: DataDir, plan: list[Request]) -> pl.DataFrame:
    spans = scan(data, "spans").filter(pl.col(c.NAME) == a.VLLM_REQUEST_SPAN).collect()
    per_request = spans.group_by(c.GEN_AI_REQUEST_ID).agg(pl.col(c.SPAN_ID).n_unique())
    assert sorted(per_request[c.GEN_AI_REQUEST_ID]) == sorted(r.span_request_id for r in plan)
    assert per_request[c.SPAN_ID].to_list() == [1] * len(plan)  # exactly one span each
    return spans.unique([c.TRACE_ID, c.SPAN_ID])  # delivery is at least once


def engine_points(data: DataDir, name: str) -> pl.DataFrame:
    return (scan(data, "metric_points").filter(pl.col(c.METRIC_NAME) == name)
            .sort(c.TS_NS).collect())


def check_against_metrics(spans: pl.DataFrame, plan: list[Request], before: str, after: str,
                          report: dict) -> None:
    """Span sums vs vLLM's /metrics histogram sums and counters over the same requests."""
    b, e = totals(before), totals(after)
    n = len(plan)
    for column, hist in PHASES.items():
        assert e[f"{hist}_count"] - b[f"{hist}_count"] == n, hist
        metric_sum = e[f"{hist}_sum"] - b[f"{hist}_sum"]
        span_sum = spans[column].sum()
        report[column] = (round(span_sum, 6), round(metric_sum, 6))
        assert span_sum == pytest.approx(metric_sum, rel=1e-6, abs=1e-6), column
    assert spans[c.GEN_AI_PROMPT_TOKENS].sum() == e[PROMPT_COUNTER] - b[PROMPT_COUNTER]
    assert spans[c.GEN_AI_COMPLETION_TOKENS].sum() == e[GENERATION_COUNTER] - b[
        GENERATION_COUNTER]
    by_id = {row[c.GEN_AI_REQUEST_ID]: row for row in spans.iter_rows(named=True)}
    for req in plan:
        row = by_id[req.span_request_id]
        usage = req.response["usage"]
        assert row[c.GEN_AI_COMPLETION_TOKENS] == usage["completion_tokens"] == req.max_tokens
        assert row[c.GEN_AI_PROMPT_TOKENS] == usage["prompt_tokens"]
        assert row[c.GEN_AI_MAX_TOKENS] == req.max_tokens
        # phases nest: queue + prefill + decode = e2e minus the API server's own time
        inside = row[c.GEN_AI_TIME_IN_QUEUE_S] + row[c.GEN_AI_PREFILL_S] + row[c.GEN_AI_DECODE_S]
        assert 0 <= inside <= row[c.GEN_AI_E2E_S] + 1e-6
        assert row[c.END_NS] - row[c.START_NS] > 0


def check_traceparents(spans: pl.DataFrame, plan: list[Request]) -> int:
    by_id = {row[c.GEN_AI_REQUEST_ID]: row for row in spans.iter_rows(named=True)}
    joined = 0
    for req in plan:
        row = by_id[req.span_request_id]
        if req.traceparent:
            assert (row[c.TRACE_ID], row[c.PARENT_SPAN_ID]) == req.traceparent
            joined += 1
        else:
            assert row[c.PARENT_SPAN_ID] in ("", None)
    return joined


def mixed_plan(rng: random.Random) -> list[Request]:
    """Bursts and a trickle; prompt lengths 3..150 words, max_tokens 1..96, a third with a
    traceparent."""
    plan = []
    for burst_at in (0.0, 2.0, 4.0):
        for _ in range(12):  # concurrent burst (more than --max-num-seqs: some queue)
            plan.append(Request(burst_at, prompt_of(rng, rng.randint(3, 150)),
                                rng.randint(1, 96)))
    for i in range(12):  # a trickle between and after the bursts
        plan.append(Request(0.5 + i * 0.45, prompt_of(rng, rng.randint(3, 60)),
                            rng.randint(1, 32)))
    for req in plan[::3]:
        req.traceparent = new_traceparent()
    return plan


def test_real_vllm_spans_agree_with_its_metrics_and_agent_moves(
        vllm_python: Path, tiny_model: Path, tmp_path: Path) -> None:
    instance = f"{HOST}/tiny-0"
    data = DataDir(tmp_path / "data")
    report: dict = {}
    resource = {a.SERVICE_INSTANCE_ID: instance, a.HOST_NAME: HOST,
                a.GEN_AI_REQUEST_MODEL: "tiny", "region": "e2e-1"}
    plan = mixed_plan(random.Random(4))
    with running_collector(data.root, config={"flush_interval_s": 0.5}) as col:
        t0 = time.monotonic()
        with running_vllm(vllm_python, tiny_model, tmp_path / "vllm.log",
                          otlp_endpoint=col.grpc_address, service_name="vllm-tiny",
                          resource_attributes=resource,
                          args=["--max-model-len", "256", "--max-num-seqs", "8"]) as vllm:
            report["vllm_ready_s"] = round(time.monotonic() - t0, 1)
            with running_agent(tmp_path, col.grpc_address, vllm.url, instance):
                wait_for_agent(data)  # idle scrapes first
                before = vllm.metrics_text()
                t1 = time.monotonic()
                loadgen.run(vllm.port, plan)
                report["load_s"] = round(time.monotonic() - t1, 2)
                report["max_send_lag_s"] = round(max(r.lag_s for r in plan), 4)
                time.sleep(1.0)  # let the agent scrape the settled state
                after = vllm.metrics_text()
                t2 = time.monotonic()
                wait_for_spans(data, len(plan))
                report["spans_landed_after_s"] = round(time.monotonic() - t2, 1)
    assert all(r.status == 200 for r in plan), [r.response for r in plan if r.status != 200]

    spans = spans_by_request(data, plan)
    check_against_metrics(spans, plan, before, after, report)
    report["traceparent_joined"] = check_traceparents(spans, plan)
    assert report["traceparent_joined"] == len(plan[::3])
    assert set(spans[c.SERVICE_NAME]) == {"vllm-tiny"} and set(spans[c.HOST_NAME]) == {HOST}
    assert all(json.loads(r)[a.SERVICE_INSTANCE_ID] == instance
               for r in spans[c.RESOURCE_ATTRIBUTES])
    assert int(spans[c.KIND].unique().item()) == 2  # SERVER

    # the agent's engine metrics moved with the load, and end at vLLM's own counters
    running = engine_points(data, a.ENGINE_NUM_RUNNING)
    usage = engine_points(data, a.ENGINE_KV_CACHE_USAGE)
    prompt = engine_points(data, a.ENGINE_PROMPT_TOKENS)
    assert running[c.VALUE].max() > 0 and running[c.VALUE][0] == 0
    assert usage[c.VALUE].max() > 0
    assert prompt[c.VALUE][-1] == totals(after)[PROMPT_COUNTER] > prompt[c.VALUE][0]
    attrs = json.loads(running[c.ATTRIBUTES][0])
    assert attrs == {a.ENGINE_INSTANCE: instance, a.ENGINE_MODEL_NAME: "tiny"}
    mapping = engine_points(data, a.ENGINE_INSTANCE_GPUS)
    power = engine_points(data, a.HW_POWER)
    gpu_uuid = json.loads(power[c.ATTRIBUTES][0])[a.HW_ID]
    assert {json.loads(x)[a.HW_ID] for x in mapping[c.ATTRIBUTES]} == {gpu_uuid}
    check_pipeline(data, plan, spans, instance, gpu_uuid, report)
    report.update(requests=len(plan), running_max=running[c.VALUE].max(),
                  kv_usage_max=usage[c.VALUE].max(), queue_p_max=spans[
                      c.GEN_AI_TIME_IN_QUEUE_S].max(), agent_scrapes=running.height)
    print("\nE2E normal run:", json.dumps(report, default=str))


def check_pipeline(data: DataDir, plan: list[Request], spans: pl.DataFrame, instance: str,
                   gpu_uuid: str, report: dict) -> None:
    """The real ``fleetlens pipeline`` turns this run's raw data into requests, engine and GPU
    samples and per-request energy (the fake GPU is mapped to the real vLLM instance)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETLENS_")}
    done = subprocess.run([sys.executable, "-m", "fleetlens", "pipeline", "--data-dir",
                           str(data.root), "--full", "--no-progress"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    requests = scan(data, "requests").collect()
    ours = requests.filter(pl.col(c.REQUEST_ID).is_in([r.span_request_id for r in plan]))
    assert ours.height == len(plan)
    assert set(ours[c.INSTANCE_ID]) == {instance} and set(ours[c.MODEL]) == {"tiny"}
    assert ours[c.QUEUE_S].sum() == pytest.approx(spans[c.GEN_AI_TIME_IN_QUEUE_S].sum())
    assert ours[c.OUTPUT_TOKENS].sum() == sum(r.max_tokens for r in plan)
    engine = scan(data, "engine_samples").filter(pl.col(c.INSTANCE_ID) == instance).collect()
    assert set(engine[c.MODEL]) == {"tiny"}
    assert engine[c.NUM_RUNNING].max() > 0 and engine[c.KV_CACHE_USAGE].max() > 0
    gpus = scan(data, "gpu_samples").collect()
    assert set(gpus[c.GPU_UUID]) == {gpu_uuid} and gpus[c.POWER_W].min() >= 70.0
    energy = scan(data, "request_energy").collect()
    attributed = energy.filter(pl.col(c.REQUEST_ID).is_in(ours[c.REQUEST_ID].implode()))
    assert attributed.height == len(plan) and attributed[c.ENERGY_J].sum() > 0
    report.update(pipeline_requests=ours.height, engine_samples=engine.height,
                  gpu_samples=gpus.height, energy_j=round(attributed[c.ENERGY_J].sum(), 1))


def pressure_plan(rng: random.Random) -> list[Request]:
    """Short-ish prompts (about 100 tokens) that grow by 380 tokens, 8 at a time every second:
    far more KV than a 16-block cache holds."""
    return [Request(burst * 1.0, prompt_of(rng, 100), 380,
                    new_traceparent() if i % 4 == 0 else None)
            for burst in range(4) for i in range(8)]


def test_real_vllm_under_kv_pressure_preempts_and_queues(
        vllm_python: Path, tiny_model: Path, tmp_path: Path) -> None:
    instance = f"{HOST}/tiny-small-kv"
    data = DataDir(tmp_path / "data")
    report: dict = {}
    plan = pressure_plan(random.Random(7))
    with running_collector(data.root, config={"flush_interval_s": 0.5}) as col:
        with running_vllm(vllm_python, tiny_model, tmp_path / "vllm.log",
                          otlp_endpoint=col.grpc_address, service_name="vllm-tiny",
                          resource_attributes={a.SERVICE_INSTANCE_ID: instance,
                                               a.HOST_NAME: HOST},
                          kv_cache_space_gib=None,  # the variable would override the bytes
                          args=["--max-model-len", "512", "--max-num-seqs", "32",
                                "--kv-cache-memory-bytes", str(512 * 1024)]) as vllm:
            with running_agent(tmp_path, col.grpc_address, vllm.url, instance):
                wait_for_agent(data)
                before = vllm.metrics_text()
                t1 = time.monotonic()
                loadgen.run(vllm.port, plan)
                report["load_s"] = round(time.monotonic() - t1, 2)
                time.sleep(1.0)
                after = vllm.metrics_text()
                wait_for_spans(data, len(plan))
    assert all(r.status == 200 for r in plan), [r.response for r in plan if r.status != 200]
    spans = spans_by_request(data, plan)
    check_against_metrics(spans, plan, before, after, report)
    assert check_traceparents(spans, plan) == len(plan) // 4

    preempted = totals(after)[PREEMPTION_COUNTER] - totals(before)[PREEMPTION_COUNTER]
    assert preempted > 0
    agent_preemptions = engine_points(data, a.ENGINE_PREEMPTIONS)[c.VALUE]
    assert agent_preemptions.max() == totals(after)[PREEMPTION_COUNTER]
    waiting = engine_points(data, a.ENGINE_NUM_WAITING)[c.VALUE]
    usage = engine_points(data, a.ENGINE_KV_CACHE_USAGE)[c.VALUE]
    assert waiting.max() > 0  # requests queued for KV space
    assert usage.max() > 0.9  # the cache was (nearly) full
    queue = spans[c.GEN_AI_TIME_IN_QUEUE_S]
    report.update(preemptions=preempted, waiting_max=waiting.max(), kv_usage_max=usage.max(),
                  queue_s_max=round(queue.max(), 3), queue_s_median=round(queue.median(), 3),
                  e2e_s_max=round(spans[c.GEN_AI_E2E_S].max(), 3))
    print("\nE2E KV-pressure run:", json.dumps(report, default=str))
