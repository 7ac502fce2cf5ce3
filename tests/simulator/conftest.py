"""Fixtures: an in-process OTLP/gRPC sink on a free loopback port, and in-memory exporters."""

from __future__ import annotations

import threading
from concurrent import futures

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1 import (
    metrics_service_pb2,
    metrics_service_pb2_grpc,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


class OtlpSink(trace_service_pb2_grpc.TraceServiceServicer,
               metrics_service_pb2_grpc.MetricsServiceServicer):
    """Keeps every Export request in memory."""

    def __init__(self) -> None:
        self.traces: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.metrics: list[metrics_service_pb2.ExportMetricsServiceRequest] = []
        self.lock = threading.Lock()

    def Export(self, request, context):  # noqa: N802 (gRPC method name)
        with self.lock:
            if isinstance(request, trace_service_pb2.ExportTraceServiceRequest):
                self.traces.append(request)
                return trace_service_pb2.ExportTraceServiceResponse()
            self.metrics.append(request)
            return metrics_service_pb2.ExportMetricsServiceResponse()

    def spans(self) -> list[tuple]:
        """Every span as (resource attributes, span message)."""
        out = []
        for request in self.traces:
            for rs in request.resource_spans:
                resource = {kv.key: kv.value for kv in rs.resource.attributes}
                for ss in rs.scope_spans:
                    out += [(resource, ss.scope.name, span) for span in ss.spans]
        return out


@pytest.fixture
def otlp_sink():
    """(endpoint, sink): a gRPC server on 127.0.0.1 implementing Trace and Metrics Export."""
    sink = OtlpSink()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2),
                         options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)])
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(sink, server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(sink, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", sink
    finally:
        server.stop(grace=None).wait()


class MemoryMetricExporter(MetricExporter):
    """Keeps every exported ``MetricsData``."""

    def __init__(self) -> None:
        super().__init__(preferred_temporality={})
        self.data = []

    def export(self, metrics_data, timeout_millis: float = 10_000, **kwargs):
        self.data.append(metrics_data)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        return None

    def points(self):
        """Every data point as (host, metric name, attributes, value, ts_ns)."""
        out = []
        for data in self.data:
            for rm in data.resource_metrics:
                host = rm.resource.attributes.get("host.name")
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        out += [(host, m.name, dict(p.attributes), p.value, p.time_unix_nano)
                                for p in m.data.data_points]
        return out


@pytest.fixture
def memory_exporters():
    """(span exporter, metric exporter) keeping everything in memory."""
    return InMemorySpanExporter(), MemoryMetricExporter()
