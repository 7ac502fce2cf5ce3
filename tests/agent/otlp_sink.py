"""An in-process OTLP/gRPC sink (traces and metrics) on a free loopback port, for tests."""

from __future__ import annotations

import threading
from concurrent import futures
from dataclasses import dataclass

import grpc
from opentelemetry.proto.collector.metrics.v1 import (
    metrics_service_pb2,
    metrics_service_pb2_grpc,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


def any_value(v: AnyValue):
    """An OTLP AnyValue as a Python value."""
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [any_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind) if kind else None


def attrs(kvs) -> dict:
    return {kv.key: any_value(kv.value) for kv in kvs}


@dataclass(frozen=True)
class Point:
    """One metric data point, flattened."""

    name: str
    kind: str  # gauge | sum
    unit: str
    ts_ns: int
    start_ns: int
    value: float
    attributes: dict
    resource: dict
    is_monotonic: bool


@dataclass(frozen=True)
class SpanRow:
    """One span, flattened (ids as lowercase hex)."""

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict
    resource: dict


class OtlpSink(trace_service_pb2_grpc.TraceServiceServicer,
               metrics_service_pb2_grpc.MetricsServiceServicer):
    """Collects every Export; ``endpoint`` is ``127.0.0.1:PORT``."""

    def __init__(self, require_token: str | None = None,
                 tls: tuple[bytes, bytes] | None = None) -> None:
        """``tls`` is (private key PEM, certificate PEM): serve TLS only."""
        self._lock = threading.Lock()
        self.metric_requests: list = []
        self.trace_requests: list = []
        self.metadata: list[dict] = []
        self.require_token = require_token
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(self, self._server)
        if tls:
            creds = grpc.ssl_server_credentials([tls])
            self.port = self._server.add_secure_port("127.0.0.1:0", creds)
        else:
            self.port = self._server.add_insecure_port("127.0.0.1:0")
        self.endpoint = f"127.0.0.1:{self.port}"

    def __enter__(self) -> OtlpSink:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(grace=None)

    def _check(self, context) -> None:
        meta = dict(context.invocation_metadata())
        with self._lock:
            self.metadata.append(meta)
        if self.require_token and meta.get("authorization") != f"Bearer {self.require_token}":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "bad token")

    def Export(self, request, context):  # noqa: N802  (gRPC method name)
        self._check(context)
        with self._lock:
            if isinstance(request, trace_service_pb2.ExportTraceServiceRequest):
                self.trace_requests.append(request)
                return trace_service_pb2.ExportTraceServiceResponse()
            self.metric_requests.append(request)
            return metrics_service_pb2.ExportMetricsServiceResponse()

    def points(self) -> list[Point]:
        with self._lock:
            requests = list(self.metric_requests)
        out = []
        for req in requests:
            for rm in req.resource_metrics:
                resource = attrs(rm.resource.attributes)
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        kind = m.WhichOneof("data")
                        body = getattr(m, kind)
                        for p in body.data_points:
                            value = p.as_double if p.WhichOneof("value") == "as_double" \
                                else p.as_int
                            out.append(Point(m.name, kind, m.unit, p.time_unix_nano,
                                             p.start_time_unix_nano, value, attrs(p.attributes),
                                             resource, getattr(body, "is_monotonic", False)))
        return out

    def spans(self) -> list[SpanRow]:
        with self._lock:
            requests = list(self.trace_requests)
        out = []
        for req in requests:
            for rs in req.resource_spans:
                resource = attrs(rs.resource.attributes)
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        out.append(SpanRow(s.trace_id.hex(), s.span_id.hex(),
                                           s.parent_span_id.hex(), s.name, s.kind,
                                           s.start_time_unix_nano, s.end_time_unix_nano,
                                           attrs(s.attributes), resource))
        return out
