"""The test helpers' free ports: one process never gets the same port twice."""

from __future__ import annotations

import socket

from fleetlens.collector.testing import free_port


def test_free_port_never_returns_a_port_twice() -> None:
    # A collector takes two in a row (gRPC and HTTP): the kernel handed back the port it had
    # just released often enough that 500 calls held about 10 repeats, and a real-vLLM run's
    # HTTP server once took its agent's gRPC connections.
    ports = [free_port() for _ in range(500)]
    assert len(set(ports)) == len(ports)


def test_free_port_is_bindable_on_loopback() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        assert sock.getsockname() == ("127.0.0.1", port)
