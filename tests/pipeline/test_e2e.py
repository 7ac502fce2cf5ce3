"""End to end: OpenTelemetry SDK -> real collector process -> `fleetlens pipeline` (real CLI
process) -> `requests` and `windows` equal what was sent."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time

import polars as pl
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind, set_span_in_context

from fleetlens.collector.testing import gauge_request, running_collector
from fleetlens.pipeline.schema import FLEET_WIDE
from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.storage import DataDir, connect

pytestmark = pytest.mark.e2e

NS = 1_000_000_000
# Ten minutes into an hour two hours ago (the collector refuses timestamps days away from now).
T0 = (time.time_ns() // (3600 * NS) - 2) * 3600 * NS + 600 * NS


def _quantile(values: list[float], q: float) -> float:
    """Linear-interpolation quantile (what quantile_cont computes), nulls ignored."""
    s = sorted(v for v in values if v is not None)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _send(endpoint: str, rng: random.Random) -> list[dict]:
    resource = Resource.create({a.SERVICE_NAME: "chat", a.HOST_NAME: "gpu-01",
                                a.SERVICE_INSTANCE_ID: "gpu-01/vllm-0",
                                "gen_ai.request.model": "llama-3-8b", "region": "eu-west"})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(SimpleSpanProcessor(
        OTLPSpanExporter(endpoint=endpoint, insecure=True)))
    tracer = provider.get_tracer("vllm.tracing")
    sent = []
    for i in range(120):
        arrival = T0 + i * NS // 2
        queue, prefill, decode = rng.uniform(0, 0.1), rng.uniform(0.02, 0.2), rng.uniform(0, 2)
        prompt, completion = rng.randint(1, 2000), rng.choice([0, 1, 2, 50, 300])
        e2e = queue + prefill + decode + 0.004
        gateway = None
        if i % 3 == 0:  # a third of the traffic comes through a gateway span
            gateway = tracer.start_span(a.GATEWAY_SPAN, kind=SpanKind.SERVER,
                                        start_time=arrival - 3_000_000)
        ctx = set_span_in_context(gateway) if gateway else None
        span = tracer.start_span(a.VLLM_REQUEST_SPAN, context=ctx, kind=SpanKind.SERVER,
                                 start_time=arrival)
        attrs = {
            a.GEN_AI_REQUEST_ID: f"cmpl-{i}-0", a.GEN_AI_TIME_IN_QUEUE: queue,
            a.GEN_AI_TTFT: queue + prefill + 0.002, a.GEN_AI_E2E: e2e,
            a.GEN_AI_PREFILL: prefill, a.GEN_AI_DECODE: decode,
            a.GEN_AI_INFERENCE: prefill + decode, a.GEN_AI_PROMPT_TOKENS: prompt,
            a.GEN_AI_COMPLETION_TOKENS: completion, a.GEN_AI_MAX_TOKENS: 512, a.GEN_AI_N: 1,
            a.GEN_AI_FINISH_REASONS: json.dumps(["length" if completion == 300 else "stop"]),
        }
        span.set_attributes(attrs)
        end = arrival + int(e2e * NS)
        span.end(end_time=end)
        if gateway:
            gateway.end(end_time=end + 5_000_000)
        sent.append({"id": f"cmpl-{i}-0", "arrival": arrival, "end": end, "queue": queue,
                     "prefill": prefill, "decode": decode, "e2e": e2e,
                     # no token, no first token: the pipeline leaves that TTFT null
                     "ttft": queue + prefill + 0.002 if completion else None, "prompt": prompt,
                     "completion": completion, "gateway": gateway is not None})
    assert provider.force_flush(30_000)
    provider.shutdown()
    return sent


def test_sdk_to_collector_to_pipeline(tmp_path) -> None:
    rng = random.Random(7)
    data = tmp_path / "data"
    with running_collector(data) as col:
        sent = _send(col.grpc_address, rng)
        gpu = {a.HW_ID: "GPU-0", a.HW_NAME: "NVIDIA H100", a.HW_TYPE: a.HW_TYPE_GPU,
               a.GPU_INDEX: 0}
        points = [(T0 - 5 * NS + k * NS // 10, 400.0, gpu) for k in range(800)]
        col.export(gauge_request(a.HW_POWER, points, unit="W", host_name="gpu-01"))
        mapping = {a.ENGINE_INSTANCE: "gpu-01/vllm-0", a.HW_ID: "GPU-0"}
        col.export(gauge_request(a.ENGINE_INSTANCE_GPUS, [(T0, 1.0, mapping)],
                                 host_name="gpu-01"))
        assert col.stop() == 0
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETLENS_")}
    out = subprocess.run([sys.executable, "-m", "fleetlens", "pipeline", "--data-dir",
                          str(data), "--json"], capture_output=True, text=True, timeout=120,
                         env=env)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["rows_written"]["requests"] == len(sent)

    con = connect(DataDir(data))
    got = con.sql("select * from requests order by arrival_ns").pl()
    assert got["request_id"].to_list() == [s["id"] for s in sent]
    assert got["arrival_ns"].to_list() == [s["arrival"] for s in sent]
    assert got["end_ns"].to_list() == [s["end"] for s in sent]
    assert set(got["model"]) == {"llama-3-8b"} and set(got["region"]) == {"eu-west"}
    assert set(got["instance_id"]) == {"gpu-01/vllm-0"}
    for col_name, key in (("queue_s", "queue"), ("prefill_s", "prefill"),
                          ("decode_s", "decode"), ("e2e_s", "e2e"), ("ttft_s", "ttft")):
        assert got[col_name].to_list() == pytest.approx([s[key] for s in sent], abs=1e-12)
    assert got["input_tokens"].to_list() == [s["prompt"] for s in sent]
    assert got["output_tokens"].to_list() == [s["completion"] for s in sent]
    tpot = [s["decode"] / (s["completion"] - 1) if s["completion"] > 1 else None for s in sent]
    assert got["tpot_s"].to_list() == pytest.approx(tpot, abs=1e-12)
    assert got["finish_reason"].to_list() == [
        "length" if s["completion"] == 300 else "stop" for s in sent]
    network = [0.008 if s["gateway"] else None for s in sent]
    assert got["network_s"].to_list() == pytest.approx(network, abs=1e-9)

    windows = con.sql(f"select * from windows where host_name = '{FLEET_WIDE}' "
                      "order by window_start_ns").pl()
    by_window: dict[int, list[dict]] = {}
    for s in sent:
        by_window.setdefault(s["arrival"] - s["arrival"] % (60 * NS), []).append(s)
    assert windows["window_start_ns"].to_list() == sorted(by_window)
    for row in windows.iter_rows(named=True):
        group = by_window[row["window_start_ns"]]
        assert row["requests"] == len(group)
        assert row["output_tokens"] == sum(s["completion"] for s in group)
        assert row["ttft_p99_s"] == pytest.approx(_quantile([s["ttft"] for s in group], 0.99))
        assert row["e2e_p50_s"] == pytest.approx(_quantile([s["e2e"] for s in group], 0.5))
        assert row["energy_j"] is not None and row["energy_j"] > 0
    energy = con.sql("select sum(measured_j) m, sum(attributed_j) a, sum(idle_j) i "
                     "from gpu_window_energy").pl().row(0)
    # 400 W for the 79.9 s the samples span
    assert energy[0] == pytest.approx(400 * 79.9, rel=1e-9)
    assert energy[1] + energy[2] == pytest.approx(energy[0], rel=1e-9)
    assert isinstance(got, pl.DataFrame)
