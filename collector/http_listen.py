"""The OTLP/HTTP receiver's listening socket and TLS context (:mod:`collector.http_server`)."""

from __future__ import annotations

import socket
import ssl

from fleetlens.collector.config import CollectorConfig


def tls_context(config: CollectorConfig) -> ssl.SSLContext | None:
    """The server's TLS context from ``config.tls`` (None: plain TCP); client certificates
    required when ``client_ca_file`` is set (mTLS)."""
    tls = config.tls
    if not tls.enabled:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(tls.cert_file, tls.key_file)
        if tls.client_ca_file:
            context.load_verify_locations(tls.client_ca_file)
            context.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as exc:
        raise RuntimeError(f"cannot load TLS certificates for OTLP/HTTP: {exc}") from None
    return context


def listen(address: str) -> socket.socket:
    """A non-blocking listening socket on ``host:port`` with SO_REUSEPORT (one per worker)."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    family, kind, proto, _, where = socket.getaddrinfo(host, int(port),
                                                      type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(where)
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock
