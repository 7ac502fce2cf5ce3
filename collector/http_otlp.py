"""OTLP/HTTP semantics, apart from the bytes on the wire: which request goes where, what is
refused before its body is read, and the reply of each outcome.

The server (``collector/http_server.py``) parses HTTP/1.1 and calls :func:`plan` once the
head is in, then :func:`export` with the whole body, and writes the :class:`Reply`. Keeping
this pure lets the fuzz targets drive the same path without sockets.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.rpc import status_pb2

from fleetlens.collector.errors import (
    ExportError,
    InvalidRequest,
    StorageFailure,
    http_headers,
)
from fleetlens.collector.http_body import (
    GZIP,
    JSON,
    PROTOBUF,
    check_encoding,
    check_framing,
    check_media,
    inflate,
)
from fleetlens.collector.ingest import Ingest
from fleetlens.collector.otlp_json import parse_json, to_json
from fleetlens.collector.signals import BY_PATH, Signal
from fleetlens.collector.telemetry import log

TEXT = "text/plain"
PROMETHEUS = "text/plain; version=0.0.4"
#: Request header names, lower-cased, each with every value it was sent with.
Headers = dict[str, list[str]]


@dataclass(frozen=True)
class Reply:
    """One HTTP response; ``close`` ends the connection after it."""

    status: int
    body: bytes
    content_type: str = TEXT
    headers: tuple[tuple[str, str], ...] = ()
    close: bool = False


@dataclass(frozen=True)
class Plan:
    """An Export request whose head passed every check: its body may now be read.

    ``length`` is None for a chunked body.
    """

    signal: Signal
    as_json: bool
    gzip: bool
    length: int | None


def _first(headers: Headers, name: str) -> str | None:
    values = headers.get(name)
    return values[0] if values else None


def error_reply(error: ExportError, as_json: bool, close: bool = True) -> Reply:
    """The OTLP error reply: a ``google.rpc.Status`` in the request's encoding."""
    status = status_pb2.Status(code=error.grpc_code.value[0], message=str(error))
    body = to_json(status).encode() if as_json else status.SerializeToString()
    return Reply(error.http_status, body, JSON if as_json else PROTOBUF,
                 tuple(http_headers(error).items()), close)


def handle_get(ingest: Ingest, path: str, headers: Headers) -> Reply:
    """``GET /health`` and ``GET /metrics`` (bearer token required when configured)."""
    if path == "/health":
        return Reply(200, b"ok\n")
    if path != "/metrics":
        return Reply(404, b"not found\n")
    try:
        ingest.authenticate(_first(headers, "authorization"))
    except ExportError as error:
        return Reply(error.http_status, f"{error}\n".encode(), close=True)
    return Reply(200, ingest.telemetry.prometheus().encode(), PROMETHEUS)


def plan(ingest: Ingest, method: str, target: str, headers: Headers) -> Plan | Reply:
    """Check an Export request's head; a :class:`Reply` means refuse it unread."""
    path = target.split("?", 1)[0]
    signal = BY_PATH.get(path)
    if method == "GET":
        return handle_get(ingest, path, headers) if signal is None else Reply(
            405, b"use POST\n", headers=(("Allow", "POST"),), close=True)
    if signal is None:
        return Reply(404, b"not found\n", close=True)
    if method != "POST":
        return Reply(405, b"use POST\n", headers=(("Allow", "POST"),), close=True)
    content_type = _first(headers, "content-type")
    as_json = (content_type or "").split(";", 1)[0].strip().lower() == JSON
    try:
        ingest.authenticate(_first(headers, "authorization"))
        as_json = check_media(content_type)
        encoding = check_encoding(_first(headers, "content-encoding"))
        length = check_framing(headers.get("content-length", []),
                               headers.get("transfer-encoding", []))
        if length is not None:
            ingest.check_size(length)
    except ExportError as error:
        return error_reply(error, as_json)
    return Plan(signal, as_json, encoding == GZIP, length)


def _inflate(ingest: Ingest, body: bytes) -> bytes:
    try:
        return inflate(body, ingest.config.max_request_bytes, ingest.check_size)
    except InvalidRequest:
        ingest.telemetry.add("invalid_requests")
        raise


def export(ingest: Ingest, todo: Plan, body: bytes, peer: str | None = None) -> Reply:
    """Decode and store one Export body (runs on a handler thread: it waits for the WAL).

    ``peer`` ("ipv4:127.0.0.1:51234", as gRPC names it) is the connection, for its budget
    of new service/host names.
    """
    try:
        if todo.gzip:
            body = _inflate(ingest, body)
        if todo.as_json:
            request = parse_json(todo.signal, body, ingest)
            response = ingest.export(todo.signal, request.SerializeToString(), request,
                                     peer=peer)
            return Reply(200, to_json(response).encode(), JSON)
        response = ingest.export(todo.signal, body, peer=peer)
        return Reply(200, response.SerializeToString(), PROTOBUF)
    except ExportError as error:
        return error_reply(error, todo.as_json, close=False)
    except Exception as exc:  # a bug: answer retryable, never OK, and say so in the log
        log.exception("OTLP/HTTP Export failed unexpectedly")
        return error_reply(StorageFailure(f"internal error: {type(exc).__name__}"), todo.as_json)
