"""``fleetlens traces export``: a stored trace as OTLP/JSON that the protobuf JSON mapping
parses into an ExportTraceServiceRequest, and that a fleetlens collector, sent it over
OTLP/HTTP JSON, stores exactly as the first one did (issue 35 item 5)."""

from __future__ import annotations

import base64
import json
import random
import time
import urllib.request
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from fleetlens.cli import cli
from fleetlens.collector.testing import (
    SERVER,
    kvs,
    resource,
    running_collector,
    vllm_span,
)
from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, scan

NS = 1_000_000_000
CONFIG = {"flush_interval_s": 0.2}
TRACE = bytes.fromhex("4bf92f3577b34da6a3ce929d0e0e4736")
OTHER_TRACE = bytes.fromhex("00f067aa0ba902b700f067aa0ba902b7")


def _rich_request() -> ExportTraceServiceRequest:
    """One trace over two resources: a gateway span with every kind of attribute value, an
    event, a link and an error status, and the engine's vLLM span (promoted attributes)."""
    start = time.time_ns() - 10 * NS
    gateway = trace_pb2.Span(
        trace_id=TRACE, span_id=bytes.fromhex("a1a1a1a1a1a1a1a1"), name="POST /v1/chat",
        kind=SERVER, start_time_unix_nano=start, end_time_unix_nano=start + 3 * NS,
        trace_state="vendor=1", flags=1,
        attributes=kvs({"http.route": "/v1/chat", "http.status_code": 500, "ratio": 0.25,
                        "retry": True, "tags": ["a", "b", 3], "user": {"tier": "gold", "n": 2},
                        "raw": b"\x00\xff\x10", "empty": ""}),
        events=[trace_pb2.Span.Event(time_unix_nano=start + NS, name="retry",
                                     attributes=kvs({"attempt": 2}))],
        links=[trace_pb2.Span.Link(trace_id=OTHER_TRACE, span_id=bytes.fromhex("b2" * 8),
                                   trace_state="k=v", attributes=kvs({"why": "fan-out"}))],
        status=trace_pb2.Status(code=trace_pb2.Status.STATUS_CODE_ERROR, message="upstream 500"),
    )
    engine = vllm_span(random.Random(5), start_ns=start + NS // 100, trace_id=TRACE,
                       span_id=bytes.fromhex("c3c3c3c3c3c3c3c3"))
    engine.parent_span_id = gateway.span_id
    return ExportTraceServiceRequest(resource_spans=[
        trace_pb2.ResourceSpans(
            resource=resource("gateway", "edge-01", region="eu-west", zones=["a", "b"]),
            schema_url="https://opentelemetry.io/schemas/1.26.0",
            scope_spans=[trace_pb2.ScopeSpans(
                scope=common_pb2.InstrumentationScope(name="gw", version="2.1",
                                                      attributes=kvs({"lib": "x"})),
                spans=[gateway])]),
        trace_pb2.ResourceSpans(
            resource=resource("vllm", "gpu-01"),
            scope_spans=[trace_pb2.ScopeSpans(
                scope=common_pb2.InstrumentationScope(name="vllm.tracing"), spans=[engine])]),
    ])


def _stored(root: Path) -> pl.DataFrame:
    """The stored spans, less what each delivery has of its own (its receive time)."""
    return (scan(DataDir(root), t.SPANS).collect().drop(c.RECEIVED_NS)
            .unique().sort(c.SPAN_ID))


def _export(root: Path, ident: str) -> str:
    out = CliRunner().invoke(cli, ["traces", "export", ident, "--data-dir", str(root)])
    assert out.exit_code == 0, out.output
    return out.stdout


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data directory where a collector stored the rich trace, delivered twice."""
    root = tmp_path_factory.mktemp("export") / "first"
    with running_collector(root, config=CONFIG) as col:
        request = _rich_request()
        col.export(request)
        col.export(request)  # at least once: the export keeps one copy of each span
        assert col.stop() == 0
    return root


def test_the_export_parses_into_an_export_trace_service_request(first: Path) -> None:
    data = json.loads(_export(first, TRACE.hex()))
    # OTLP/JSON ids are hex; the protobuf JSON mapping reads bytes as base64 (OTLP spec).
    for item in data["resourceSpans"]:
        for scope in item["scopeSpans"]:
            for span in scope["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
                for link in span.get("links", []):
                    for key in ("traceId", "spanId"):
                        link[key] = base64.b64encode(bytes.fromhex(link[key])).decode()
    request = json_format.Parse(json.dumps(data), ExportTraceServiceRequest())
    spans = [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert len(spans) == 2  # one copy of each, though delivered twice
    assert {s.trace_id for s in spans} == {TRACE}
    gateway = next(s for s in spans if s.name == "POST /v1/chat")
    engine = next(s for s in spans if s.name == a.VLLM_REQUEST_SPAN)
    assert engine.parent_span_id == gateway.span_id
    attrs = {kv.key: kv.value for kv in gateway.attributes}
    assert attrs["raw"].bytes_value == b"\x00\xff\x10"
    assert attrs["http.status_code"].int_value == 500
    assert attrs["user"].kvlist_value.values[0].key == "tier"
    assert gateway.links[0].trace_id == OTHER_TRACE
    assert gateway.events[0].name == "retry"
    assert gateway.status.code == trace_pb2.Status.STATUS_CODE_ERROR
    promoted = {kv.key: kv.value for kv in engine.attributes}
    assert promoted[a.GEN_AI_PROMPT_TOKENS].HasField("int_value")
    assert promoted[a.GEN_AI_E2E].HasField("double_value")
    assert gateway.start_time_unix_nano > 0 and gateway.end_time_unix_nano > 0


def test_a_collector_fed_the_export_over_http_json_stores_the_same_spans(
        first: Path, tmp_path: Path) -> None:
    text = _export(first, TRACE.hex())
    second = tmp_path / "second"
    with running_collector(second, config=CONFIG) as col:
        request = urllib.request.Request(f"{col.http_url}/v1/traces", data=text.encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200
            assert json.loads(response.read()) == {}  # every span accepted
        assert col.stop() == 0
    before, after = _stored(first), _stored(second)
    assert before.height == 2
    assert after.to_dicts() == before.to_dicts()


def test_a_request_id_exports_its_trace_and_unknown_ids_are_one_line(first: Path) -> None:
    engine = _stored(first).filter(pl.col(c.NAME) == a.VLLM_REQUEST_SPAN)
    request_id = engine[c.GEN_AI_REQUEST_ID][0]
    # no requests table in this directory (no pipeline run): the spans' gen_ai.request.id
    out = CliRunner().invoke(cli, ["traces", "export", request_id, "--data-dir", str(first)])
    assert out.exit_code == 0, out.output
    assert out.stdout == CliRunner().invoke(
        cli, ["traces", "export", TRACE.hex(), "--data-dir", str(first)]).stdout
    out = CliRunner().invoke(cli, ["traces", "export", "cmpl-nope", "--data-dir", str(first)])
    assert out.exit_code == 1 and out.output.count("\n") == 1, out.output
    assert "neither a trace id" in out.output
    missing = CliRunner().invoke(cli, ["traces", "export", "ab" * 16, "--data-dir", str(first)])
    assert missing.exit_code == 1 and "no spans of trace" in missing.output
    assert "Traceback" not in missing.output


def test_search_options_before_export_are_refused_not_dropped(first: Path) -> None:
    out = CliRunner().invoke(cli, ["traces", "--data-dir", str(first), "--host", "h1",
                                   "export", TRACE.hex()])
    assert out.exit_code == 2 and "takes no search options (--host)" in out.output
    # --data-dir (and --config) before the subcommand are fine
    out = CliRunner().invoke(cli, ["traces", "--data-dir", str(first), "export", TRACE.hex()])
    assert out.exit_code == 0 and "resourceSpans" in out.stdout
