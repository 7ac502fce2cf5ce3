"""Issue 33 #3: connections must not take the descriptors that ingest, the WAL and publishing
need. A real collector runs with 256 descriptors (soft and hard, so raising the soft limit
cannot help) while hundreds of connections hold on; Exports must still be stored."""

from __future__ import annotations

import contextlib
import os
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetlens.collector.testing import (
    RunningCollector,
    free_port,
    running_collector,
    vllm_trace_request,
)
from tests.collector.test_forward import sent_span_keys, span_keys, wait_until

pytestmark = [pytest.mark.e2e]
FEW_FILES = (256, 256)
FLOOD = 300  # connections: more than the collector has descriptors


@contextlib.contextmanager
def flood(address: str, first_bytes: bytes) -> Iterator[list[socket.socket]]:
    """``FLOOD`` connections to ``address`` that send ``first_bytes`` and then nothing."""
    host, _, port = address.rpartition(":")
    socks: list[socket.socket] = []
    sent: set[int] = set()
    try:
        for _ in range(FLOOD):
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex((host, int(port)))  # past the listen backlog: never completes
            socks.append(sock)
        # Connections past the listen backlog complete only as the server accepts (SYNs are
        # retried after 1, 3, 7, 15 s): wait until all are in, or none joined for 8 s.
        last, stable_since = -1, time.monotonic()
        while time.monotonic() - stable_since < 8.0:
            connected = _send_all(socks, first_bytes, sent)
            if connected == FLOOD:
                break
            if connected != last:
                last, stable_since = connected, time.monotonic()
            time.sleep(0.25)
        yield socks
    finally:
        for sock in socks:
            sock.close()


def _send_all(socks: list[socket.socket], data: bytes, sent: set[int]) -> int:
    """Send ``data`` once on every connected socket; returns how many are connected."""
    connected = 0
    for sock in socks:
        try:
            sock.getpeername()
        except OSError:
            continue
        connected += 1
        if data and id(sock) not in sent:
            with contextlib.suppress(OSError):
                sock.send(data)
                sent.add(id(sock))
    return connected


def _stores_both_ways(col: RunningCollector, seed: int) -> None:
    """An Export over gRPC and one over OTLP/HTTP are acknowledged and published."""
    over_grpc, over_http = vllm_trace_request(5, seed=seed), vllm_trace_request(5, seed=seed + 1)
    col.export(over_grpc, timeout=20)
    post = urllib.request.Request(f"{col.http_url}/v1/traces",
                                  data=over_http.SerializeToString(), method="POST",
                                  headers={"Content-Type": "application/x-protobuf"})
    with urllib.request.urlopen(post, timeout=20) as reply:
        assert reply.status == 200
    expected = sent_span_keys(over_grpc) | sent_span_keys(over_http)
    wait_until(lambda: expected <= set(span_keys(col.data_dir)), 30, "the Parquet flush")


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_trickling_scrapes_do_not_starve_ingest(tmp_path: Path) -> None:
    metrics = f"127.0.0.1:{free_port()}"
    config = {"flush_interval_s": 0.3, "self_metrics_address": metrics}
    with running_collector(tmp_path / "col", config=config, nofile=FEW_FILES) as col:
        with flood(metrics, b"GET /metrics HTTP/1.1\r\nHost: x\r\n"):  # never finished
            _stores_both_ways(col, seed=1)
            held = _open_fds(col.pid)
            assert held < FEW_FILES[0] - 64, held  # the scrapes took a few slots, no more
        with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=30) as reply:
            assert b"otelcol_receiver_accepted_spans_total" in reply.read()
        assert col.stop() == 0
    assert "Too many open files" not in col.logs()


def test_idle_http_connections_leave_descriptors_for_grpc_and_publishing(
        tmp_path: Path) -> None:
    config = {"flush_interval_s": 0.3, "self_metrics_address": ""}
    with running_collector(tmp_path / "col", config=config, nofile=FEW_FILES) as col:
        with flood(col.http_address, b""):
            col.export(vllm_trace_request(5, seed=3), timeout=20)
            wait_until(lambda: sent_span_keys(vllm_trace_request(5, seed=3))
                       <= set(span_keys(col.data_dir)), 30, "the Parquet flush")
            assert _open_fds(col.pid) <= FEW_FILES[0] - 32
        _stores_both_ways(col, seed=5)
        assert col.stop() == 0
    assert "OTLP/HTTP connections capped" in col.logs()


def test_the_soft_descriptor_limit_is_raised_to_the_hard_limit(tmp_path: Path) -> None:
    config = {"self_metrics_address": ""}
    with running_collector(tmp_path / "col", config=config, nofile=(256, 4096)) as col:
        limits = Path(f"/proc/{col.pid}/limits").read_text()
        line = next(x for x in limits.splitlines() if x.startswith("Max open files"))
        assert line.split()[3:5] == ["4096", "4096"], line
        assert "open files limit raised from 256 to 4096" in col.logs()
