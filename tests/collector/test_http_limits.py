"""OTLP/HTTP bounds against a real collector on 127.0.0.1: a trickling client is dropped,
connections and handler threads are capped, and running out of file descriptors does not
make the server spin. No wall-clock bound is asserted: each case checks what happened."""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from fleetlens.collector.signals import SPANS
from fleetlens.collector.testing import running_collector, vllm_trace_request

pytestmark = pytest.mark.e2e
PROTOBUF = "application/x-protobuf"


def _connect(address: str) -> socket.socket:
    host, _, port = address.rpartition(":")
    return socket.create_connection((host, int(port)), timeout=30)


def _request(address: str) -> int:
    """POST a 3-span Export on a new connection; the HTTP status."""
    body = vllm_trace_request(3).SerializeToString()
    req = urllib.request.Request(f"http://{address}{SPANS.http_path}", data=body,
                                 headers={"Content-Type": PROTOBUF})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        with err:
            return err.code


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_client_trickling_one_byte_at_a_time_is_dropped(tmp_path) -> None:
    # http.server gave each recv() 60 s, so a byte every 59 s held the connection forever.
    config = {"http_request_timeout_s": 2.0}
    head = (f"POST {SPANS.http_path} HTTP/1.1\r\nHost: x\r\nContent-Type: {PROTOBUF}\r\n"
            "Content-Length: 100\r\n\r\n").encode() + b"\0" * 100
    with running_collector(tmp_path / "data", config=config) as col:
        dropped, answer = False, b""
        with _connect(col.http_address) as sock:
            for i in range(len(head)):  # 0.25 s a byte: about 40 s for all of it
                try:
                    sock.sendall(head[i:i + 1])
                except OSError:  # reset by the server
                    dropped = True
                    break
                time.sleep(0.25)
                sock.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    answer += sock.recv(4096)
                    if answer.endswith(b"\n") and b"408" in answer:
                        dropped = True
                sock.setblocking(True)
                if dropped:
                    break
        assert dropped, f"still connected after sending {len(head)} bytes slowly"
        assert answer == b"" or answer.startswith(b"HTTP/1.1 408 "), answer
        assert _request(col.http_address) == 200  # others are served meanwhile and after
        assert col.stop() == 0


def test_connections_and_handler_threads_are_capped(tmp_path) -> None:
    config = {"http_max_connections": 24, "http_threads": 2}
    with running_collector(tmp_path / "data", config=config) as col:
        assert _request(col.http_address) == 200  # the handler pool has started
        before = _threads(col.pid)
        # 24 clients that sent half a request head and wait: each cost a thread in
        # http.server (ThreadingHTTPServer), here only a socket.
        held = [_connect(col.http_address) for _ in range(24)]
        for sock in held:
            sock.sendall(f"POST {SPANS.http_path} HTTP/1.1\r\nHost: x\r\n".encode())
        time.sleep(1.0)  # let the server accept them all
        grown = _threads(col.pid) - before
        assert grown <= 2, f"{grown} more threads for 24 waiting connections"
        # One connection more is refused with a retryable 503, not queued or served.
        assert _request(col.http_address) == 503
        for sock in held:
            sock.close()
        for _ in range(100):  # until the server has seen the closes
            if _request(col.http_address) == 200:
                break
            time.sleep(0.1)
        else:
            pytest.fail("still refusing after the held connections closed")
        assert col.stop() == 0


def test_out_of_file_descriptors_does_not_spin_and_recovers(tmp_path) -> None:
    with running_collector(tmp_path / "data") as col:
        assert _request(col.http_address) == 200
        pid = col.pid
        limits = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        in_use = len(os.listdir(f"/proc/{pid}/fd"))
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (in_use + 2, limits[1]))
        try:
            # More connections than descriptors left: the rest wait in the backlog while
            # accept() fails with EMFILE. http.server's loop retried at once, forever.
            held = [_connect(col.http_address) for _ in range(8)]
            time.sleep(0.5)
            cpu_before, wall_before = _cpu_s(pid), time.monotonic()
            time.sleep(3.0)
            busy = (_cpu_s(pid) - cpu_before) / (time.monotonic() - wall_before)
            assert busy < 0.1, f"collector used {busy:.0%} of a core while out of descriptors"
            for sock in held:
                sock.close()
        finally:
            resource.prlimit(pid, resource.RLIMIT_NOFILE, limits)
        for _ in range(100):
            if _request(col.http_address) == 200:
                break
            time.sleep(0.1)
        else:
            pytest.fail("not serving again after descriptors were freed")
        assert col.stop() == 0
