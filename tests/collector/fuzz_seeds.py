"""Seed inputs of the fuzz targets (``bench/fuzz.py --write-seeds`` writes them under
``tests/collector/fuzz_corpus/``): valid requests of each signal and encoding, and the
framing cases of the HTTP path. Dated :data:`fuzz_targets.SEED_NS`, so they are stable."""

from __future__ import annotations

import gzip
import random

from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from fleetlens.collector.otlp_json import to_json
from fleetlens.collector.signals import METRICS, SPANS
from fleetlens.collector.testing import (
    gauge_request,
    log_request,
    resource,
    trace_request,
    vllm_span,
)
from tests.collector.fuzz_targets import SEED_NS


def _requests() -> dict[str, dict[str, object]]:
    rng = random.Random(7)
    spans = trace_request([vllm_span(rng, start_ns=SEED_NS + i) for i in range(3)])
    odd = trace_request([trace_pb2.Span(trace_id=b"\0" * 16, span_id=b"\1" * 8, name="zero",
                                        start_time_unix_nano=SEED_NS,
                                        end_time_unix_nano=SEED_NS - 1)])
    gauge = gauge_request("gpu.util", [(SEED_NS, 0.5, {"gpu": 0}), (SEED_NS + 1, 1.0, {})])
    hist = METRICS.request(resource_metrics=[metrics_pb2.ResourceMetrics(
        resource=resource(), scope_metrics=[metrics_pb2.ScopeMetrics(metrics=[
            metrics_pb2.Metric(name="lat", histogram=metrics_pb2.Histogram(
                aggregation_temporality=2, data_points=[metrics_pb2.HistogramDataPoint(
                    time_unix_nano=SEED_NS, start_time_unix_nano=SEED_NS - 10, count=3,
                    sum=1.5, bucket_counts=[1, 2], explicit_bounds=[0.5])]))])])])
    logs = log_request(["hello", "world"], ts_ns=SEED_NS)
    return {"spans": {"vllm": spans, "invalid": odd, "empty": SPANS.request()},
            "metrics": {"gauge": gauge, "histogram": hist},
            "logs": {"two": logs}}


def _http(body: bytes, headers: dict[str, str], path: str = SPANS.http_path) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: x", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def seeds() -> dict[str, dict[str, bytes]]:
    """Target name -> {file name: input}."""
    found: dict[str, dict[str, bytes]] = {}
    for folder, requests in _requests().items():
        found[f"{folder}_pb"] = {n: r.SerializeToString() for n, r in requests.items()}
        found[f"{folder}_json"] = {n: to_json(r).encode() for n, r in requests.items()}
    requests = _requests()
    body = requests["spans"]["vllm"].SerializeToString()
    json_body = to_json(requests["spans"]["vllm"]).encode()
    metrics_body = requests["metrics"]["gauge"].SerializeToString()
    pb = "application/x-protobuf"
    zipped = gzip.compress(body[:40]) + gzip.compress(body[40:])
    found["http"] = {
        "length": _http(body, {"Content-Type": pb, "Content-Length": str(len(body))}),
        "chunked": _http(_chunked(body), {"Content-Type": pb, "Transfer-Encoding": "chunked"}),
        "gzip2": _http(zipped, {"Content-Type": pb, "Content-Encoding": "gzip",
                                "Content-Length": str(len(zipped))}),
        "json": _http(_chunked(json_body), {"Content-Type": "application/json",
                                            "Transfer-Encoding": "chunked"}),
        "short": _http(body[:50], {"Content-Type": pb, "Content-Length": str(len(body))}),
        "te-cl": _http(_chunked(body), {"Content-Type": pb, "Content-Length": str(len(body)),
                                        "Transfer-Encoding": "chunked"}),
        "health": b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
        "metrics": _http(metrics_body, {"Content-Type": pb,
                                        "Content-Length": str(len(metrics_body))},
                         METRICS.http_path),
    }
    return found


def _chunked(body: bytes) -> bytes:
    return b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
