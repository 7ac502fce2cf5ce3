"""Issue 33 #4: request bodies held in flight are bounded per worker. A real collector; raw
sockets send large OTLP/HTTP bodies one byte short and hold them."""

from __future__ import annotations

import socket
import threading
import urllib.request
from pathlib import Path

import pytest

from fleetlens.collector.testing import running_collector, vllm_trace_request

pytestmark = [pytest.mark.e2e]
MIB = 1 << 20
BODY = 8 * MIB
BUDGET = 20 * MIB  # two such bodies fit, the third does not


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _hold_body(address: str, answers: list[bytes], socks: list[socket.socket]) -> None:
    """Send a ``BODY``-byte request but its last byte; keep what the server answers."""
    host, _, port = address.rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    socks.append(sock)
    head = (b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
            b"Content-Length: " + str(BODY).encode() + b"\r\n\r\n")
    try:
        sock.sendall(head + b"\x00" * (BODY - 1))
        sock.settimeout(5)
        answers.append(sock.recv(4096))
    except OSError:  # TimeoutError included: held, unanswered, as it should be
        answers.append(b"")


def test_bodies_past_the_workers_budget_are_refused_retryably(tmp_path: Path) -> None:
    config = {"max_request_bytes": BODY, "http_body_budget_bytes": BUDGET,
              "self_metrics_address": "", "http_request_timeout_s": 60.0}
    with running_collector(tmp_path / "col", config=config) as col:
        before = _rss_mib(col.pid)
        answers: list[bytes] = []
        socks: list[socket.socket] = []
        threads = [threading.Thread(target=_hold_body, args=(col.http_address, answers, socks))
                   for _ in range(5)]
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            refused = [a for a in answers if a.startswith(b"HTTP/1.1 503")]
            held = [a for a in answers if not a]
            # Before the fix all five were held (40 MiB); now two are, the rest are told
            # to come back later (retryable, never 413: they are not too large).
            assert len(held) == 2 and len(refused) == 3, answers
            assert all(b"Retry-After:" in a for a in refused)
            during = _rss_mib(col.pid)
            # Small Exports still fit in what the budget has left.
            post = urllib.request.Request(
                f"{col.http_url}/v1/traces", method="POST",
                data=vllm_trace_request(5, seed=1).SerializeToString(),
                headers={"Content-Type": "application/x-protobuf"})
            with urllib.request.urlopen(post, timeout=30) as reply:
                assert reply.status == 200
        finally:
            for sock in socks:
                sock.close()
        print(f"RSS {before:.0f} MiB idle, {during:.0f} MiB with 5 bodies of 8 MiB held")
        assert col.stop() == 0
