"""OTLP/HTTP receiver: ``POST /v1/{traces,metrics,logs}`` (protobuf or JSON, optional gzip),
``GET /metrics`` (Prometheus self-telemetry) and ``GET /health``.

Bodies are read only up to ``max_request_bytes`` and gzip is inflated with the same bound,
so a decompression bomb costs at most that much memory. TLS is negotiated per connection in
the connection's own thread, so a slow or plaintext client cannot stall the listener.
"""

from __future__ import annotations

import socket
import ssl
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from google.rpc import status_pb2

from fleetlens.collector.config import CollectorConfig
from fleetlens.collector.errors import (
    ExportError,
    InvalidRequest,
    LengthRequired,
    StorageFailure,
    UnsupportedMedia,
    http_headers,
)
from fleetlens.collector.ingest import Ingest
from fleetlens.collector.otlp_json import parse_json, to_json
from fleetlens.collector.signals import BY_PATH
from fleetlens.collector.telemetry import log

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
_CHUNK = 1 << 20


def inflate(body: bytes, limit: int, ingest: Ingest) -> bytes:
    """gzip-decompress ``body`` without ever producing more than ``limit`` bytes."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise InvalidRequest(f"bad gzip body: {exc}") from None
    ingest.check_size(len(out))
    if not inflater.eof:
        raise InvalidRequest("truncated gzip body")
    return out


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    server_version = "fleetlens-collector"
    #: Seconds a connection may sit idle (or trickle a body) before it is closed.
    timeout = 60

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass  # per-request access logs would flood; counters live in /metrics

    def _send(self, status: int, body: bytes, content_type: str,
              headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def _error(self, error: ExportError, as_json: bool) -> None:
        status = status_pb2.Status(code=error.grpc_code.value[0], message=str(error))
        body = to_json(status).encode() if as_json else status.SerializeToString()
        self._send(error.http_status, body, JSON if as_json else PROTOBUF, http_headers(error))

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        ingest = self.server.ingest
        if self.path == "/health":
            self._send(200, b"ok\n", "text/plain")
            return
        if self.path != "/metrics":
            self._send(404, b"not found\n", "text/plain")
            return
        try:
            ingest.authenticate(self.headers.get("Authorization"))
        except ExportError as error:
            self._send(error.http_status, f"{error}\n".encode(), "text/plain")
            return
        text = ingest.telemetry.prometheus().encode()
        self._send(200, text, "text/plain; version=0.0.4")

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        ingest = self.server.ingest
        signal = BY_PATH.get(self.path.split("?", 1)[0])
        as_json = self.headers.get("Content-Type", "").split(";")[0].strip() == JSON
        try:
            if signal is None:
                self.close_connection = True
                self._send(404, b"not found\n", "text/plain")
                return
            ingest.authenticate(self.headers.get("Authorization"))
            body = self._read_body(ingest)
            if as_json:
                request = parse_json(signal, body, ingest)
                response = ingest.export(signal, request.SerializeToString(), request)
                self._send(200, to_json(response).encode(), JSON)
            else:
                response = ingest.export(signal, body)
                self._send(200, response.SerializeToString(), PROTOBUF)
        except ExportError as error:
            self.close_connection = True  # the body may be unread; never reuse the stream
            self._error(error, as_json)
        except Exception as exc:
            log.exception("OTLP/HTTP Export failed unexpectedly")
            self.close_connection = True
            self._error(StorageFailure(f"internal error: {type(exc).__name__}"), as_json)

    def _read_body(self, ingest: Ingest) -> bytes:
        kind = self.headers.get("Content-Type", "").split(";")[0].strip()
        if kind not in (PROTOBUF, JSON):
            raise UnsupportedMedia(f"unsupported Content-Type {kind!r}; use {PROTOBUF} or {JSON}")
        encoding = self.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("identity", "gzip"):
            raise UnsupportedMedia(f"unsupported Content-Encoding {encoding!r}")
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            raise LengthRequired("Content-Length is required") from None
        ingest.check_size(length)
        body = bytearray()
        while len(body) < length:
            chunk = self.rfile.read(min(_CHUNK, length - len(body)))
            if not chunk:
                break
            body += chunk
        if encoding == "gzip":
            return inflate(bytes(body), ingest.config.max_request_bytes, ingest)
        return bytes(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], ingest: Ingest,
                 tls: ssl.SSLContext | None) -> None:
        self.ingest = ingest
        self.tls = tls
        super().__init__(address, _Handler, bind_and_activate=False)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        self.server_bind()
        self.server_activate()

    def finish_request(self, request: Any, client_address: Any) -> None:
        if self.tls is not None:
            request.settimeout(10)
            try:
                request = self.tls.wrap_socket(request, server_side=True)
            except (OSError, ssl.SSLError) as exc:
                log.info("TLS handshake with %s failed: %s", client_address[0], exc)
                return
            request.settimeout(60)
            try:
                super().finish_request(request, client_address)
            finally:
                request.close()  # the wrapped socket owns the descriptor now
            return
        super().finish_request(request, client_address)


def _tls_context(config: CollectorConfig) -> ssl.SSLContext | None:
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


def start_http(config: CollectorConfig, ingest: Ingest) -> ThreadingHTTPServer:
    """Start the OTLP/HTTP server on ``config.http_address`` in a background thread."""
    host, _, port = config.http_address.rpartition(":")
    try:
        server = _Server((host.strip("[]"), int(port)), ingest, _tls_context(config))
    except OSError as exc:
        raise RuntimeError(f"cannot listen for OTLP/HTTP on {config.http_address}: {exc}") from None
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server
