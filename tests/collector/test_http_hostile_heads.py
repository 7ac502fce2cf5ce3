"""Issue 33 #9 and #10: what an OTLP/HTTP client can make a worker hold or parse before any
token is checked. A real collector; raw sockets."""

from __future__ import annotations

import socket
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from fleetlens.collector.http_body import MAX_HEAD_LINES
from fleetlens.collector.testing import running_collector, vllm_trace_request
from tests.collector.certs import make_pki
from tests.collector.test_forward import wait_until

pytestmark = [pytest.mark.e2e]


def _status(address: str, head: bytes) -> int:
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head)
        answer = sock.recv(4096)
    return int(answer.split(b" ", 2)[1])


def test_a_head_of_many_tiny_headers_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    def head(lines: int) -> bytes:
        return (b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf"
                b"\r\nContent-Length: 0\r\n" + b"a:\r\n" * lines + b"\r\n")

    with running_collector(tmp_path / "col", config={"self_metrics_address": ""}) as col:
        # 12,900 such lines fit under the 64 KiB head limit and cost 50x a plain request.
        assert _status(col.http_address, head(12_900)) == 431
        assert _status(col.http_address, head(MAX_HEAD_LINES + 1)) == 431
        assert _status(col.http_address, head(MAX_HEAD_LINES - 10)) == 200  # an empty Export
        # A JSON body full of newlines is a body, not a head.
        body = b"{\n" + b"\n" * 5000 + b"}"
        assert _status(col.http_address, b"POST /v1/traces HTTP/1.1\r\nHost: x\r\n"
                       b"Content-Type: application/json\r\nContent-Length: "
                       + str(len(body)).encode() + b"\r\n\r\n" + body) == 200


def test_tls_handshakes_in_progress_count_against_the_connection_cap(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    config = {"self_metrics_address": "", "http_max_connections": 4,
              "tls": {"cert_file": str(pki["server_cert"]), "key_file": str(pki["server_key"])}}
    with running_collector(tmp_path / "col", config=config) as col:
        host, _, port = col.http_address.rpartition(":")
        # Connections that never start their handshake, until the server turns one away
        # unanswered (the cap and its refusal slot are full). Before the fix handshakes in
        # progress were not counted: none was turned away until their 10 s ran out.
        silent = [socket.create_connection((host, int(port)), timeout=30) for _ in range(8)]
        try:
            wait_until(lambda: any(_closed_by_server(s) for s in silent), 5,
                       "a connection past the cap to be closed")
            # Fill what the start-up port probe (closed, so its handshake failed) freed.
            silent += [socket.create_connection((host, int(port)), timeout=30)
                       for _ in range(4)]
            context = ssl.create_default_context(cafile=str(pki["ca"]))
            post = urllib.request.Request(
                f"https://{col.http_address}/v1/traces", method="POST",
                data=vllm_trace_request(3, seed=1).SerializeToString(),
                headers={"Content-Type": "application/x-protobuf"})
            with pytest.raises((urllib.error.URLError, ConnectionError, ssl.SSLError)) as refused:
                urllib.request.urlopen(post, timeout=30, context=context)
            if isinstance(refused.value, urllib.error.HTTPError):
                assert refused.value.code == 503, refused.value
        finally:
            for sock in silent:
                sock.close()


def _closed_by_server(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except ConnectionError:
        return True
