"""The real OpenTelemetry SDK exporters deliver to the collector; `fleetlens sql` counts it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
    OTLPMetricExporter as GrpcMetricExporter,
)
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
    OTLPMetricExporter as HttpMetricExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from fleetlens.collector.testing import running_collector
from fleetlens.pipeline.schema import attributes as a

pytestmark = pytest.mark.e2e


def _sql(data_dir, query: str) -> list[dict]:
    out = subprocess.run(
        [sys.executable, "-m", "fleetlens", "sql", query, "--data-dir", str(data_dir),
         "--format", "json"], capture_output=True, text=True, check=True, timeout=60)
    return json.loads(out.stdout)


def _send_spans(exporter, service: str, count: int) -> None:
    provider = TracerProvider(resource=Resource.create({a.SERVICE_NAME: service}))
    provider.add_span_processor(BatchSpanProcessor(exporter, max_export_batch_size=64))
    tracer = provider.get_tracer("fleetlens.tests")
    for i in range(count):
        with tracer.start_as_current_span(a.VLLM_REQUEST_SPAN) as span:
            span.set_attribute(a.GEN_AI_PROMPT_TOKENS, i)
            span.set_attribute(a.GEN_AI_TTFT, 0.25)
            span.set_attribute("custom.key", "v")
    assert provider.force_flush(30_000)
    provider.shutdown()


def _send_metrics(exporter, service: str) -> None:
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=60_000)
    provider = MeterProvider(resource=Resource.create({a.SERVICE_NAME: service}),
                             metric_readers=[reader])
    counter = provider.get_meter("fleetlens.tests").create_counter("test.requests")
    counter.add(5, {"route": "/v1/completions"})
    assert provider.force_flush(30_000)
    provider.shutdown()


def test_sdk_exporters_over_grpc_and_http_reach_parquet(tmp_path) -> None:
    data = tmp_path / "data"
    with running_collector(data) as col:
        _send_spans(GrpcSpanExporter(endpoint=col.grpc_address, insecure=True), "svc-grpc", 150)
        _send_spans(HttpSpanExporter(endpoint=f"{col.http_url}/v1/traces"), "svc-http", 70)
        _send_metrics(GrpcMetricExporter(endpoint=col.grpc_address, insecure=True), "m-grpc")
        _send_metrics(HttpMetricExporter(endpoint=f"{col.http_url}/v1/metrics"), "m-http")
        assert col.stop() == 0
    rows = _sql(data, "select service_name, count(*) as n, sum(gen_ai_prompt_tokens)::BIGINT as p, "
                      "count(gen_ai_ttft_s) as t from spans group by 1 order by 1")
    assert rows == [
        {"service_name": "svc-grpc", "n": 150, "p": sum(range(150)), "t": 150},
        {"service_name": "svc-http", "n": 70, "p": sum(range(70)), "t": 70},
    ]
    attrs = _sql(data, "select distinct attributes from spans")
    assert [json.loads(r["attributes"]) for r in attrs] == [{"custom.key": "v"}]
    points = _sql(data, "select distinct service_name, metric_name, kind, value, is_monotonic "
                        "from metric_points order by 1")
    assert [(p["service_name"], p["metric_name"], p["kind"], p["value"], p["is_monotonic"])
            for p in points] == [("m-grpc", "test.requests", "sum", 5.0, True),
                                 ("m-http", "test.requests", "sum", 5.0, True)]
    # Nothing is left in the WAL after a clean stop.
    assert not list((data / "wal").rglob("*.wal"))
