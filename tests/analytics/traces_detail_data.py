"""A data directory holding one fully known trace for the trace detail tests: spans decoded
by the collector's own decoder (attributes of every kind, resource attributes, an event, a
link), its request, its energy, and samples of its instance, of a neighbour instance on the
same host and of a GPU the instance does not run on (which the detail must leave out)."""

from __future__ import annotations

import polars as pl
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from fleetlens.collector.decode_common import Limits
from fleetlens.collector.decode_spans import decode_spans
from fleetlens.collector.name_budget import NameLimiter
from fleetlens.collector.signals import SPANS
from fleetlens.collector.testing import SERVER, kvs, resource
from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import conform
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir
from tests.dashboard.synth import write_table

NS, MS = 1_000_000_000, 1_000_000
#: The trace's first span starts here: 2026-09-21 14:13:20.123456789 UTC.
T0 = 1_790_000_000 * NS + 123_456_789
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
LINKED = "00f067aa0ba902b700f067aa0ba902b7"
GATEWAY, ENGINE = "a1a1a1a1a1a1a1a1", "c3c3c3c3c3c3c3c3"
REQUEST, HOST, INSTANCE = "cmpl-known-0", "gpu-07", "gpu-07/vllm-1"
#: The instance's GPU and one of the same host that serves another instance.
MINE, OTHER = "GPU-aaaa", "GPU-bbbb"
#: The engine span: 4.5 ms after the gateway's, 2.25 s long.
ARRIVAL, END = T0 + 4_500_000, T0 + 4_500_000 + 2_250 * MS
ENERGY_J = 321.5


def _spans() -> pl.DataFrame:
    gateway = trace_pb2.Span(
        trace_id=bytes.fromhex(TRACE), span_id=bytes.fromhex(GATEWAY), name="POST /v1/chat",
        kind=SERVER, start_time_unix_nano=T0, end_time_unix_nano=END + 1_250_000,
        attributes=kvs({"http.route": "/v1/chat", "retry": True, "tags": ["a", 3]}),
        events=[trace_pb2.Span.Event(time_unix_nano=T0 + 1_234_000_000, name="retry",
                                     attributes=kvs({"attempt": 2}))],
        links=[trace_pb2.Span.Link(trace_id=bytes.fromhex(LINKED),
                                   span_id=bytes.fromhex("b2" * 8),
                                   attributes=kvs({"why": "fan-out"}))],
        status=trace_pb2.Status(code=trace_pb2.Status.STATUS_CODE_ERROR, message="upstream"))
    engine = trace_pb2.Span(
        trace_id=bytes.fromhex(TRACE), span_id=bytes.fromhex(ENGINE),
        parent_span_id=bytes.fromhex(GATEWAY), name=a.VLLM_REQUEST_SPAN, kind=SERVER,
        start_time_unix_nano=ARRIVAL, end_time_unix_nano=END,
        attributes=kvs({a.GEN_AI_REQUEST_ID: REQUEST, a.GEN_AI_PROMPT_TOKENS: 512,
                        "user.tier": "gold"}))
    request = SPANS.request(resource_spans=[
        trace_pb2.ResourceSpans(resource=resource("gateway", "edge-01", region="eu-west"),
                                scope_spans=[trace_pb2.ScopeSpans(spans=[gateway])]),
        trace_pb2.ResourceSpans(resource=resource("vllm", HOST), scope_spans=[
            trace_pb2.ScopeSpans(scope=common_pb2.InstrumentationScope(name="vllm.tracing"),
                                 spans=[engine])])])
    limits = Limits(now_ns=T0, skew_ns=3600 * NS, max_attributes=128, max_value_bytes=8192)
    out = decode_spans(request, limits, NameLimiter(10), END, request.SerializeToString())
    return conform(pl.DataFrame(out.columns), t.SPANS)


def _requests() -> pl.DataFrame:
    e2e = (END - ARRIVAL) / NS
    return conform(pl.DataFrame({
        c.REQUEST_ID: [REQUEST], c.TRACE_ID: [TRACE], c.SPAN_ID: [ENGINE],
        c.SERVICE_NAME: ["vllm"], c.MODEL: ["llama-8b"], c.HOST_NAME: [HOST],
        c.INSTANCE_ID: [INSTANCE], c.ARRIVAL_NS: [ARRIVAL], c.END_NS: [END],
        c.QUEUE_S: [0.25], c.PREFILL_S: [0.5], c.DECODE_S: [1.45], c.OVERHEAD_S: [0.05],
        c.TTFT_S: [0.75], c.E2E_S: [e2e], c.INPUT_TOKENS: [512], c.OUTPUT_TOKENS: [100],
        c.CACHED_TOKENS: [256], c.FINISH_REASON: ["stop"], c.IS_ERROR: [False],
    }), t.REQUESTS)


def _samples() -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """Samples every second from 10 s before the arrival to 10 s after the end: the detail
    keeps the 2 inside the request's 2.25 s and one on either side, 4 per series."""
    ts = [T0 - 10 * NS + i * NS for i in range(24)]
    engine = pl.concat([pl.DataFrame({
        c.TS_NS: ts, c.HOST_NAME: HOST, c.INSTANCE_ID: inst, c.MODEL: "llama-8b",
        c.KV_CACHE_USAGE: [0.5 + k * 0.4 + i / 100 for i in range(24)],
        c.NUM_RUNNING: [float(8 + i) for i in range(24)],
        c.NUM_WAITING: [float(i % 3) for i in range(24)],
    }) for k, inst in enumerate((INSTANCE, f"{HOST}/vllm-2"))])
    gpus = pl.concat([pl.DataFrame({
        c.TS_NS: ts, c.HOST_NAME: HOST, c.GPU_INDEX: g, c.GPU_UUID: uuid, c.GPU_MODEL: "H100",
        c.POWER_W: [300.0 + 10 * i + 100 * g for i in range(24)],
        c.SM_CLOCK_MHZ: [1980.0 - i - 500 * g for i in range(24)],
    }) for g, uuid in enumerate((MINE, OTHER))])
    mapping = pl.DataFrame({
        c.HOST_NAME: [HOST, HOST], c.INSTANCE_ID: [INSTANCE, f"{HOST}/vllm-2"],
        c.MODEL: ["llama-8b"] * 2, c.GPU_UUID: [MINE, OTHER],
        c.START_NS: [T0 - 3600 * NS] * 2, c.END_NS: [T0 + 3600 * NS] * 2})
    return (conform(engine, t.ENGINE_SAMPLES), conform(gpus, t.GPU_SAMPLES),
            conform(mapping, t.INSTANCE_GPUS))


def build(root: DataDir) -> None:
    """Write the known trace and everything around it into ``root``."""
    engine, gpus, mapping = _samples()
    write_table(root, t.SPANS, _spans(), c.START_NS)
    write_table(root, t.REQUESTS, _requests(), c.ARRIVAL_NS)
    write_table(root, t.ENGINE_SAMPLES, engine, c.TS_NS)
    write_table(root, t.GPU_SAMPLES, gpus, c.TS_NS)
    write_table(root, t.INSTANCE_GPUS, mapping, None)
    write_table(root, t.REQUEST_ENERGY, conform(pl.DataFrame({
        c.REQUEST_ID: [REQUEST, "cmpl-other"], c.HOST_NAME: [HOST, HOST],
        c.ENERGY_J: [ENERGY_J, 99.0], c.J_PER_TOKEN: [ENERGY_J / 100, 1.0],
        c.ATTRIBUTION_COVERAGE: [0.98, 1.0]}), t.REQUEST_ENERGY), None)
