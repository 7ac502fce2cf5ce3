"""Spans as vLLM V1 emits them, sent through the OpenTelemetry SDK exporters.

The simulation produces plain records (a tuple per span, a :data:`~simulator.metrics.Collection`
per host and sample); an export worker turns them into SDK ``ReadableSpan`` / ``MetricsData``
objects with the virtual timestamps (a tracer would stamp wall-clock time) and calls the
exporters' ``export``, in order. The worker runs on a thread with caller-supplied exporters
(:class:`ThreadExporter`, used by tests with in-memory exporters) or in a child process with
the real ``OTLPSpanExporter`` / ``OTLPMetricExporter`` over gRPC (:class:`ProcessExporter`),
so that protobuf encoding runs on the second core while the simulation goes on. Both queues
are bounded: memory stays flat and a slow collector slows the simulation down.
"""

from __future__ import annotations

import json
import os
import pickle
import queue
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from fleetlens.pipeline.schema import attributes as a
from fleetlens.simulator.logs import GrpcLogSender, LogRecord, logs_request
from fleetlens.simulator.metrics import metrics_data
from fleetlens.simulator.workload import Request

#: vLLM's tracer: ``init_tracer("vllm.llm_engine", ...)``.
VLLM_SCOPE = InstrumentationScope("vllm.llm_engine")
GATEWAY_SCOPE = InstrumentationScope("fleetlens.simulator.gateway")
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NS = 1_000_000_000
#: (resource key, trace id, span id, parent span id or 0, name, start ns, end ns, attributes),
#: and for a failed span a ninth item, its status message (status ERROR; simulator.failures)
SpanRecord = tuple[str, int, int, int, str, int, int, dict[str, Any]] | tuple[
    str, int, int, int, str, int, int, dict[str, Any], str]
_UNSET = Status(StatusCode.UNSET)


@dataclass
class ExportCounts:
    """What the exporters accepted and what they gave up on."""

    spans_sent: int = 0
    spans_failed: int = 0
    spans_rejected: int = 0
    points_sent: int = 0
    points_failed: int = 0
    points_rejected: int = 0
    exports_failed: int = 0
    last_rejection: str = ""
    logs_sent: int = 0
    logs_failed: int = 0
    logs_rejected: int = 0


class _PartialSuccess:
    """Wraps an OTLP exporter's gRPC stub to read each response's partial success: the SDK
    drops the response, so items the receiver rejected would otherwise count as sent."""

    def __init__(self, stub: Any) -> None:
        self.stub = stub
        self.rejected = 0
        self.message = ""

    def Export(self, *args: Any, **kwargs: Any) -> Any:  # noqa: N802 (the stub's method)
        response = self.stub.Export(*args, **kwargs)
        partial = response.partial_success
        rejected = getattr(partial, "rejected_spans", 0) or getattr(
            partial, "rejected_data_points", 0)
        if rejected:
            self.rejected += rejected
            self.message = partial.error_message
        return response


def _rejections(exporter: Any) -> _PartialSuccess | None:
    """The partial-success watcher of an OTLP/gRPC exporter (installed on first use)."""
    stub = getattr(exporter, "_client", None)
    if stub is None:
        return None
    if not isinstance(stub, _PartialSuccess):
        stub = exporter._client = _PartialSuccess(stub)
    return stub


def llm_request_record(r: Request, resource: str, start_ns: int) -> SpanRecord:
    """The ``llm_request`` span of a finished request, attribute for attribute as vLLM V1's
    ``OutputProcessor.do_tracing`` (seconds as floats; top_p/temperature absent when 0)."""
    arrival = (r.engine_ns - start_ns) / 1e9
    attributes: dict[str, Any] = {
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
    end = r.engine_ns + round((r.finish_t - arrival) * _NS)
    return (resource, r.trace, r.span, r.gateway_span_id, a.VLLM_REQUEST_SPAN, r.engine_ns, end,
            attributes)


def gateway_record(r: Request, resource: str, start_ns: int, model: str, host: str,
                   instance_id: str) -> SpanRecord:
    """The gateway's server span, parent of the ``llm_request`` span: from the client's
    request to the response, including the network hops both ways."""
    end = start_ns + round(r.finish_t * _NS) + round(r.net_s * _NS)
    attributes = {a.GEN_AI_REQUEST_MODEL: model, a.SERVER_ADDRESS: host,
                  a.FLEETLENS_INSTANCE_ID: instance_id}
    return (resource, r.trace, r.gateway_span_id, 0, a.GATEWAY_SPAN, r.client_ns, end,
            attributes)


class _Worker:
    """Builds SDK objects from records and exports them; counts the outcome."""

    def __init__(self, span_exporter: SpanExporter, metric_exporter: MetricExporter,
                 resources: dict[str, dict[str, str]], start_ns: int,
                 log_export: Callable[[Any], int] | None = None) -> None:
        self.span_exporter, self.metric_exporter = span_exporter, metric_exporter
        self.log_export = log_export  # ExportLogsServiceRequest -> rejected count
        self.resource_attrs = resources
        self.resources = {key: Resource(attrs) for key, attrs in resources.items()}
        self.start_ns = start_ns
        self.counts = ExportCounts()

    def span(self, record: SpanRecord) -> ReadableSpan:
        status = _UNSET
        if len(record) > 8:  # a failed span
            status = Status(StatusCode.ERROR, record[8])
            record = record[:8]
        res, trace, span, parent, name, start, end, attributes = record
        scope = VLLM_SCOPE if name == a.VLLM_REQUEST_SPAN else GATEWAY_SCOPE
        return ReadableSpan(
            name, SpanContext(trace, span, False, _SAMPLED),
            SpanContext(trace, parent, True, _SAMPLED) if parent else None,
            self.resources[res], attributes, kind=SpanKind.SERVER,
            instrumentation_scope=scope, status=status, start_time=start, end_time=end)

    def _logs(self, records: list) -> None:
        counts = self.counts
        if self.log_export is None:  # an in-memory run without a log sink: not asked for
            return
        try:
            rejected = self.log_export(logs_request(records, self.resource_attrs))
        except Exception:  # counted like a failed span export; the run goes on
            counts.logs_failed += len(records)
            counts.exports_failed += 1
            return
        counts.logs_sent += len(records) - rejected
        counts.logs_rejected += rejected

    def handle(self, item: tuple) -> None:
        if item[0] == "logs":
            self._logs(item[1])
            return
        counts = self.counts
        spans = item[0] == "spans"
        exporter = self.span_exporter if spans else self.metric_exporter
        watch = _rejections(exporter)
        before = watch.rejected if watch else 0
        try:
            if spans:
                n = len(item[1])
                ok = exporter.export([self.span(r) for r in item[1]]) == SpanExportResult.SUCCESS
            else:
                n = item[2]
                data = metrics_data(item[1], self.resources, self.start_ns)
                ok = exporter.export(data) == MetricExportResult.SUCCESS
        except Exception:  # an exporter error must not stop the run; it is counted
            ok = False
        rejected = (watch.rejected - before) if watch and ok else 0
        if rejected:
            counts.last_rejection = watch.message
        sent, failed = (n - rejected, 0) if ok else (0, n)
        if spans:
            counts.spans_sent += sent
            counts.spans_failed += failed
            counts.spans_rejected += rejected
        else:
            counts.points_sent += sent
            counts.points_failed += failed
            counts.points_rejected += rejected
        counts.exports_failed += 0 if ok else 1

    def shutdown(self) -> None:
        self.span_exporter.shutdown()
        self.metric_exporter.shutdown()
        close = getattr(self.log_export, "close", None)
        if close is not None:
            close()


class _Batcher:
    """Batches span records and hands every export item to ``put``."""

    def __init__(self, batch: int, put: Callable[[tuple | None], None]) -> None:
        self.batch = batch
        self.buffer: list[SpanRecord] = []
        self._put = put

    def spans(self, records: list[SpanRecord]) -> None:
        """Add span records; every full batch is queued for export."""
        self.buffer.extend(records)
        while len(self.buffer) >= self.batch:
            self._put(("spans", self.buffer[: self.batch]))
            del self.buffer[: self.batch]

    def metrics(self, collections: list, points: int) -> None:
        """Queue one sample's collections (``points`` data points)."""
        self._put(("metrics", collections, points))

    def logs(self, records: list[LogRecord]) -> None:
        """Queue engine log records (simulator.logs)."""
        if records:
            self._put(("logs", records))

    def flush(self) -> None:
        """Queue the buffered spans now (used when pacing to real time)."""
        if self.buffer:
            self._put(("spans", self.buffer))
            self.buffer = []


class ThreadExporter(_Batcher):
    """Exports on a background thread with the given SDK exporters."""

    def __init__(self, span_exporter: SpanExporter, metric_exporter: MetricExporter,
                 resources: dict[str, dict[str, str]], start_ns: int, batch: int = 1024,
                 max_queued: int = 8, log_export: Callable[[Any], int] | None = None) -> None:
        self._queue: queue.Queue = queue.Queue(max_queued)
        super().__init__(batch, self._queue.put)
        self._worker = _Worker(span_exporter, metric_exporter, resources, start_ns, log_export)
        self._thread = threading.Thread(target=self._work, name="simulator-export", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            self._worker.handle(item)

    def close(self) -> ExportCounts:
        """Export what is buffered, stop the thread, shut the exporters down."""
        self.flush()
        self._put(None)
        self._thread.join()
        self._worker.shutdown()
        return self._worker.counts


def serve(endpoint: str, insecure: bool, timeout_s: float, stream: BinaryIO) -> ExportCounts:
    """Body of the export process: read pickled items from ``stream`` (first the resources,
    start time and gRPC headers, then export items, then ``None``) and export them over
    OTLP/gRPC. The headers (a bearer token) travel on the pipe, never on the command line."""
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    resources, start_ns, headers = pickle.load(stream)
    options = dict(endpoint=endpoint, insecure=insecure, timeout=timeout_s, headers=headers)
    worker = _Worker(OTLPSpanExporter(**options), OTLPMetricExporter(**options), resources,
                     start_ns, GrpcLogSender(endpoint, insecure, timeout_s, headers))
    while (item := pickle.load(stream)) is not None:
        worker.handle(item)
    worker.shutdown()
    return worker.counts


class ProcessExporter(_Batcher):
    """Exports over OTLP/gRPC from a child process (``python -m simulator.export_process``),
    so that protobuf encoding runs beside the simulation. Items travel pickled over its stdin;
    the pipe's buffer bounds what is in flight."""

    def __init__(self, endpoint: str, resources: dict[str, dict[str, str]], start_ns: int,
                 insecure: bool = True, timeout_s: float = 30.0, batch: int = 1024,
                 token: str | None = None) -> None:
        super().__init__(batch, self._send)
        args = [sys.executable, "-m", "fleetlens.simulator.export_process", endpoint,
                "--insecure" if insecure else "--secure", str(timeout_s)]
        # the child must import this package wherever the parent found it
        root = str(Path(__file__).resolve().parents[1])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (root, os.environ.get("PYTHONPATH", "")) if p)}
        self._process = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         env=env)
        headers = {"authorization": f"Bearer {token}"} if token else None
        self._send((resources, start_ns, headers))

    def _send(self, item: Any) -> None:
        try:
            pickle.dump(item, self._process.stdin, protocol=pickle.HIGHEST_PROTOCOL)
        except (BrokenPipeError, OSError):
            raise RuntimeError(f"the export process died (exit {self._process.poll()})") from None

    def abort(self) -> None:
        """Stop the child without exporting what is left (the run failed)."""
        if self._process.poll() is None:
            self._process.kill()
        self._process.wait()
        for stream in (self._process.stdin, self._process.stdout):
            try:
                stream.close()
            except OSError:
                pass

    def close(self) -> ExportCounts:
        """Export what is buffered, wait for the child, return its counts."""
        self.flush()
        self._send(None)
        self._process.stdin.close()
        with self._process.stdout:
            out = self._process.stdout.read()
        if self._process.wait() != 0 or not out:
            raise RuntimeError(f"the export process failed (exit {self._process.returncode})")
        return ExportCounts(**json.loads(out))
