"""End to end through OTLP/gRPC: the CLI, determinism per seed, the span and metric shapes."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from fleetlens.cli import cli
from fleetlens.pipeline.schema import CAUSES
from fleetlens.pipeline.schema import attributes as a
from fleetlens.simulator import parse_scenario, run

REPO = Path(__file__).resolve().parents[2]
QUICK = REPO / "simulator" / "scenarios" / "quick.toml"


def small(duration: float = 120.0, incidents: list | None = None) -> dict:
    """A two-host scenario that simulates in well under a second."""
    return {
        "fleet": {"name": "small", "start": "2026-01-05T14:00:00Z", "duration_s": duration,
                  "drain_s": 60, "seed": 3,
                  "hosts": [{"prefix": "h", "count": 2, "gpus": 2, "region": "eu"}]},
        "deployment": [{"service": "chat", "model": "llama-3.1-8b", "tp": 1}],
        "workload": [{"service": "chat", "rate": 6.0, "gateway_share": 0.5,
                      "prefix_groups": 2, "prefix_tokens": 256, "prefix_share": 0.5}],
        "incident": incidents or [{"kind": "engine_overhead", "host": "h01",
                                   "start_s": 30, "duration_s": 30}],
    }


def test_cli_sends_vllm_spans_and_agent_metrics(otlp_sink, tmp_path: Path) -> None:
    endpoint, sink = otlp_sink
    truth = tmp_path / "truth.json"
    result = CliRunner().invoke(cli, ["simulate", "--scenario", str(QUICK), "--endpoint",
                                      endpoint, "--ground-truth", str(truth), "--max-speed"])
    assert result.exit_code == 0, result.output
    spans = sink.spans()
    llm = [(res, scope, s) for res, scope, s in spans if s.name == a.VLLM_REQUEST_SPAN]
    gateway = [s for _, _, s in spans if s.name == a.GATEWAY_SPAN]
    assert len(llm) > 5000 and 0.3 < len(gateway) / len(llm) < 0.7
    res, scope, span = llm[0]
    assert scope == "vllm.llm_engine" and span.kind == 2
    assert {a.SERVICE_NAME, a.HOST_NAME, a.SERVICE_INSTANCE_ID,
            a.RESOURCE_MODEL_KEYS[0]} <= set(res)
    assert res["region"].string_value in ("us-east-1", "us-west-2")
    keys = {kv.key for kv in span.attributes}
    assert {a.GEN_AI_TTFT, a.GEN_AI_E2E, a.GEN_AI_TIME_IN_QUEUE, a.GEN_AI_PREFILL,
            a.GEN_AI_DECODE, a.GEN_AI_INFERENCE, a.GEN_AI_PROMPT_TOKENS,
            a.GEN_AI_COMPLETION_TOKENS, a.GEN_AI_REQUEST_ID, a.GEN_AI_N} <= keys
    assert a.GEN_AI_TOP_P in keys  # vLLM emits the default 1.0 (it leaves out only 0)
    assert a.GEN_AI_REQUEST_MODEL not in keys  # vLLM puts no model on the span
    values = {kv.key: kv.value for kv in span.attributes}
    assert values[a.GEN_AI_E2E].double_value > 0
    assert abs((span.end_time_unix_nano - span.start_time_unix_nano) / 1e9
               - values[a.GEN_AI_E2E].double_value) < 1e-6
    # every gateway span is the parent of one llm_request span in the same trace
    parents = {(s.trace_id, s.parent_span_id) for _, _, s in llm if s.parent_span_id}
    assert {(s.trace_id, s.span_id) for s in gateway} == parents
    names = {m.name for req in sink.metrics for rm in req.resource_metrics
             for sm in rm.scope_metrics for m in sm.metrics}
    assert {a.HW_POWER, a.HW_ENERGY, a.GPU_CLOCK_SM, a.GPU_CLOCKS_EVENT_REASONS,
            a.ENGINE_KV_CACHE_USAGE, a.ENGINE_PREEMPTIONS, a.ENGINE_INSTANCE_GPUS} <= names
    doc = json.loads(truth.read_text())
    assert [i["cause"] for i in doc["incidents"]] == [
        "thermal_throttle", "traffic_surge", "kv_cache_pressure"]
    assert all(i["cause"] in CAUSES for i in doc["incidents"])
    assert doc["incidents"][0]["subject"].startswith("gpu_uuid=GPU-")
    assert doc["incidents"][2]["subject"] == "host_name=h01"
    assert doc["seed"] == 7 and len(doc["scenario_sha256"]) == 64


def test_same_seed_same_spans_and_truth(otlp_sink) -> None:
    endpoint, sink = otlp_sink
    scenario = parse_scenario(small())

    def once(seed: int) -> tuple[list[bytes], dict]:
        sink.traces.clear()
        result = run(scenario, endpoint, seed=seed)
        return sorted(s.SerializeToString() for _, _, s in sink.spans()), result.ground_truth

    first, truth1 = once(11)
    second, truth2 = once(11)
    other, _ = once(12)
    assert len(first) > 500
    assert first == second and truth1 == truth2
    assert first != other


def test_cli_refuses_without_a_receiver(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["simulate", "--scenario", str(QUICK), "--endpoint",
                                      "127.0.0.1:9", "--connect-timeout", "0.2"])
    assert result.exit_code != 0 and "no OTLP/gRPC receiver" in result.output


def test_cli_names_a_bad_scenario_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(QUICK.read_text().replace("max_num_seqs = 128", "max_num_seq = 128"))
    result = CliRunner().invoke(cli, ["simulate", "--scenario", str(bad)])
    assert result.exit_code != 0 and "max_num_seq" in result.output


def test_pacing_changes_nothing_but_the_wall_clock(memory_exporters) -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from tests.simulator.conftest import MemoryMetricExporter

    doc = small(duration=20.0)
    doc["fleet"]["drain_s"] = 10
    paced_spans, paced_metrics = memory_exporters
    paced = run(parse_scenario(doc), exporters=memory_exporters, speed=100.0)
    fast_spans = InMemorySpanExporter()
    fast = run(parse_scenario(doc), exporters=(fast_spans, MemoryMetricExporter()))

    def key(exporter):
        return sorted((s.context.span_id, s.start_time, s.end_time)
                      for s in exporter.get_finished_spans())

    assert paced.spans == fast.spans > 0 and key(paced_spans) == key(fast_spans)
    assert paced.sim_s == fast.sim_s == 30.0
    assert len(paced_metrics.data) == 3  # one agent collection per 10 s sample
