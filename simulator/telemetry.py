"""Spans as vLLM V1 emits them, sent through the OpenTelemetry SDK exporters.

Spans are built directly as SDK ``ReadableSpan`` objects with virtual timestamps (a tracer
would stamp wall-clock time) and handed to any ``SpanExporter`` (``OTLPSpanExporter`` over
gRPC in a real run, an in-memory exporter in tests). Metrics arrive as ready ``MetricsData``
(:mod:`simulator.metrics`). One background thread exports, in order, so that the simulation
goes on while the collector answers; its bounded queue keeps memory flat.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

from pipeline.schema import attributes as a
from simulator.workload import Request

#: vLLM's tracer: ``init_tracer("vllm.llm_engine", ...)``.
VLLM_SCOPE = InstrumentationScope("vllm.llm_engine")
GATEWAY_SCOPE = InstrumentationScope("fleetlens.simulator.gateway")
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NS = 1_000_000_000


@dataclass
class ExportCounts:
    """What the exporters accepted and what they gave up on."""

    spans_sent: int = 0
    spans_failed: int = 0
    points_sent: int = 0
    points_failed: int = 0
    exports_failed: int = 0


def llm_request_span(r: Request, resource: Resource, start_ns: int) -> ReadableSpan:
    """The ``llm_request`` span of a finished request, attribute for attribute as vLLM V1's
    ``OutputProcessor.do_tracing`` (seconds as floats; temperature/top_p absent when 0)."""
    arrival = (r.engine_ns - start_ns) / 1e9
    attributes = {
        a.GEN_AI_TTFT: r.first_token_t - arrival,
        a.GEN_AI_E2E: r.finish_t - arrival,
        a.GEN_AI_TIME_IN_QUEUE: r.scheduled_t - r.queued_t,
        a.GEN_AI_PROMPT_TOKENS: r.prompt_len,
        a.GEN_AI_COMPLETION_TOKENS: r.generated,
        a.GEN_AI_PREFILL: r.first_token_t - r.scheduled_t,
        a.GEN_AI_DECODE: r.last_token_t - r.first_token_t,
        a.GEN_AI_INFERENCE: r.last_token_t - r.scheduled_t,
        a.GEN_AI_REQUEST_ID: r.rid,
    }
    if r.top_p:
        attributes[a.GEN_AI_TOP_P] = r.top_p
    if r.max_tokens:
        attributes[a.GEN_AI_MAX_TOKENS] = r.max_tokens
    if r.temperature:
        attributes[a.GEN_AI_TEMPERATURE] = r.temperature
    attributes[a.GEN_AI_N] = 1
    parent = (SpanContext(r.trace, r.gateway_span_id, True, _SAMPLED)
              if r.gateway_span_id else None)
    return ReadableSpan(
        a.VLLM_REQUEST_SPAN, SpanContext(r.trace, r.span, False, _SAMPLED), parent,
        resource, attributes, kind=SpanKind.SERVER, instrumentation_scope=VLLM_SCOPE,
        start_time=r.engine_ns, end_time=r.engine_ns + round((r.finish_t - arrival) * _NS),
    )


def gateway_span(r: Request, resource: Resource, start_ns: int, model: str, host: str,
                 instance_id: str) -> ReadableSpan:
    """The gateway's server span, parent of the ``llm_request`` span: from the client's
    request to the response, including the network hops both ways."""
    finish_ns = start_ns + round(r.finish_t * _NS)
    attributes = {a.GEN_AI_REQUEST_MODEL: model, a.SERVER_ADDRESS: host,
                  a.FLEETLENS_INSTANCE_ID: instance_id}
    return ReadableSpan(
        a.GATEWAY_SPAN, SpanContext(r.trace, r.gateway_span_id, False, _SAMPLED), None,
        resource, attributes, kind=SpanKind.SERVER, instrumentation_scope=GATEWAY_SCOPE,
        start_time=r.client_ns, end_time=finish_ns + round(r.net_s * _NS),
    )


class Exporter:
    """Buffers spans and exports spans and metrics on one background thread, in order.

    Args:
        span_exporter: an SDK span exporter (``OTLPSpanExporter``, in-memory...).
        metric_exporter: an SDK metric exporter.
        batch: spans per export call.
        max_queued: export calls waiting at most; the simulation blocks beyond.
    """

    def __init__(self, span_exporter: SpanExporter, metric_exporter: MetricExporter,
                 batch: int = 1024, max_queued: int = 8) -> None:
        self.span_exporter, self.metric_exporter = span_exporter, metric_exporter
        self.batch = batch
        self.counts = ExportCounts()
        self.buffer: list[ReadableSpan] = []
        self._queue: queue.Queue = queue.Queue(max_queued)
        self._thread = threading.Thread(target=self._work, name="simulator-export", daemon=True)
        self._thread.start()

    def spans(self, spans: list[ReadableSpan]) -> None:
        """Add spans; a full batch is queued for export."""
        self.buffer.extend(spans)
        while len(self.buffer) >= self.batch:
            self._queue.put(("spans", self.buffer[: self.batch]))
            del self.buffer[: self.batch]

    def metrics(self, data: MetricsData, points: int) -> None:
        """Queue one collection of metrics (``points`` data points)."""
        self._queue.put(("metrics", data, points))

    def flush(self) -> None:
        """Queue the buffered spans now (used when pacing to real time)."""
        if self.buffer:
            self._queue.put(("spans", self.buffer))
            self.buffer = []

    def close(self) -> ExportCounts:
        """Export everything still buffered, stop the thread, shut the exporters down."""
        self.flush()
        self._queue.put(None)
        self._thread.join()
        self.span_exporter.shutdown()
        self.metric_exporter.shutdown()
        return self.counts

    def _work(self) -> None:
        counts = self.counts
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                if item[0] == "spans":
                    ok = self.span_exporter.export(item[1]) == SpanExportResult.SUCCESS
                    n = len(item[1])
                    counts.spans_sent += n if ok else 0
                    counts.spans_failed += 0 if ok else n
                else:
                    ok = self.metric_exporter.export(item[1]) == MetricExportResult.SUCCESS
                    counts.points_sent += item[2] if ok else 0
                    counts.points_failed += 0 if ok else item[2]
            except Exception:  # an exporter bug must not hang the simulation; count it
                ok = False
                counts.spans_failed += len(item[1]) if item[0] == "spans" else 0
                counts.points_failed += item[2] if item[0] == "metrics" else 0
            counts.exports_failed += 0 if ok else 1
