"""Issue 33 #2: a hostile or broken central collector must not empty an edge into quarantine.

A real edge collector (``running_collector``) forwards to a scripted gRPC server on 127.0.0.1
that plays the central collector: refusing everything as INVALID_ARGUMENT, answering with a
reply larger than the edge's receive limit, or storing what it gets.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from fleetlens.collector.errors import RETRY_INFO_KEY
from fleetlens.collector.testing import RunningCollector, running_collector, vllm_trace_request
from fleetlens.collector.wal_files import read_segment
from tests.collector.test_forward import FAST, sent_span_keys, wait_until

pytestmark = [pytest.mark.e2e]


class ScriptedCentral(grpc.GenericRpcHandler):
    """Answers every Export as ``mode`` says; keeps the span keys of what it stored."""

    def __init__(self) -> None:
        self.mode = "invalid"
        self.calls = 0
        self.stored: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def _export(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        with self._lock:
            self.calls += 1
            mode = self.mode
        if mode == "invalid":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "refused: hostile central")
        parsed = trace_service_pb2.ExportTraceServiceRequest.FromString(request)
        with self._lock:
            self.stored |= sent_span_keys(parsed)
        if mode == "partial":  # stored but for one span, with a hostile message
            partial = trace_service_pb2.ExportTracePartialSuccess(
                rejected_spans=1, error_message="\x1b[2J" + "x" * 1_000_000)
            return trace_service_pb2.ExportTraceServiceResponse(
                partial_success=partial).SerializeToString()
        # "huge": stored, then an answer over the edge's 4 MiB receive limit
        return b"\x00" * (5 << 20) if mode == "huge" else b""

    def service(self, details: Any) -> Any:
        return grpc.unary_unary_rpc_method_handler(self._export)


@contextlib.contextmanager
def scripted_edge(tmp_path: Path, **forward: Any) -> Iterator[tuple[ScriptedCentral,
                                                                     RunningCollector]]:
    central = ScriptedCentral()
    server = grpc.server(futures.ThreadPoolExecutor(4), handlers=[central])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        config = {**FAST, "forward": {"address": f"127.0.0.1:{port}", "insecure": True,
                                      **forward}}
        with running_collector(tmp_path / "edge", config=config) as edge:
            yield central, edge
    finally:
        server.stop(0)


def _quarantined(edge: RunningCollector) -> list[Path]:
    return sorted((edge.data_dir / "wal" / ".quarantine").glob("*"))


def _quarantined_keys(edge: RunningCollector) -> set[tuple[str, str]]:
    keys: set[tuple[str, str]] = set()
    for path in _quarantined(edge):
        for record in read_segment(path).records:
            keys |= sent_span_keys(
                trace_service_pb2.ExportTraceServiceRequest.FromString(record.payload))
    return keys


def _export_patiently(edge: RunningCollector, request: Any, tries: int = 20) -> bool:
    """Export like an OTLP client: retry UNAVAILABLE a while; False if never accepted."""
    for _ in range(tries):
        try:
            edge.export(request)
            return True
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.UNAVAILABLE  # retryable, never permanent
            time.sleep(0.25)
    return False


def test_a_central_that_refuses_everything_stops_forwarding_instead_of_draining(
        tmp_path: Path) -> None:
    limit = 200_000
    with scripted_edge(tmp_path, max_pending_bytes=limit, max_refused_in_a_row=3) as (
            central, edge):
        acked: set[tuple[str, str]] = set()
        acked_bytes = largest = 0
        for seed in range(400):  # 400 x ~10 kB: twenty times the bound
            request = vllm_trace_request(20, seed=seed)
            if not _export_patiently(edge, request):
                break
            acked |= sent_span_keys(request)
            acked_bytes += request.ByteSize()
            largest = max(largest, request.ByteSize())
        # Before the fix every refused request went to the quarantine, the bound made room
        # and the edge took all 400 (4 MB through a 200 kB bound).
        assert acked_bytes <= limit + largest
        wait_until(lambda: "treated as unhealthy" in edge.logs(), 30, "the alarm")
        # Two refusals quarantined, the third kept: the central side is to blame.
        assert len(_quarantined(edge)) == 2
        wal = edge.data_dir / "wal"
        on_disk = sum(p.stat().st_size for p in wal.rglob("*") if p.is_file()
                      and p.parent.name != ".forward")
        # The two quarantined copies are counted (their WAL file is not deleted yet).
        assert on_disk <= limit + 3 * largest
        central.mode = "ok"  # repaired: the backlog goes out, nothing acknowledged is lost
        wait_until(lambda: acked <= central.stored | _quarantined_keys(edge), 90,
                   "the backlog to reach the repaired central collector")
        wait_until(lambda: "accepts requests again" in edge.logs(), 10, "the all-clear")
        assert edge.stop() == 0


def test_an_answer_too_large_for_the_edge_is_retried_not_quarantined(tmp_path: Path) -> None:
    with scripted_edge(tmp_path) as (central, edge):
        central.mode = "huge"
        requests = [vllm_trace_request(10, seed=seed) for seed in range(3)]
        for request in requests:
            edge.export(request)
        acked = set().union(*(sent_span_keys(r) for r in requests))
        wait_until(lambda: "Received message larger than max" in edge.logs()
                   and central.calls >= 2, 30, "the edge to retry the oversized answer")
        assert not _quarantined(edge)
        central.mode = "ok"  # the same bytes go again (at least once; the pipeline dedups)
        wait_until(lambda: "again after" in edge.logs(), 30, "the resend to be answered")
        assert acked <= central.stored
        assert not _quarantined(edge)
        assert edge.stop() == 0


def test_a_request_larger_than_the_whole_edge_bound_is_refused_for_good(
        tmp_path: Path) -> None:
    with scripted_edge(tmp_path, max_pending_bytes=20_000) as (central, edge):
        big = vllm_trace_request(100, seed=1)
        assert big.ByteSize() > 20_000
        with pytest.raises(grpc.RpcError) as refused:
            edge.export(big)
        # Not UNAVAILABLE: no amount of waiting makes room for it.
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert all(key != RETRY_INFO_KEY for key, _ in refused.value.trailing_metadata() or ())
        central.mode = "ok"
        edge.export(vllm_trace_request(5, seed=2))  # a small one still goes through


def test_a_central_partial_success_message_is_logged_cut_and_escaped(tmp_path: Path) -> None:
    with scripted_edge(tmp_path) as (central, edge):
        central.mode = "partial"
        edge.export(vllm_trace_request(3, seed=4))
        wait_until(lambda: "rejected 1 spans items" in edge.logs(), 30, "the warning")
        line = next(x for x in edge.logs().splitlines() if "rejected 1 spans" in x)
        assert "\x1b" not in line and "\\x1b[2J" in line
        assert len(line) < 1000 and "(1000004 characters)" in line
