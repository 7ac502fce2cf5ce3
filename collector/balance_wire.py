"""Frames between workers for balanced Exports (:mod:`collector.balance`).

A request is ``u32 payload length | u8 signal code | u8 transport | u16 peer length``, the
peer (the client connection's name, UTF-8) and the raw OTLP protobuf payload. A reply is
``u32 body length | u8 status | u8 error kind``, then the serialized response message
(status 0) or the refusal's message (status 1, ``error kind`` indexes :data:`ERROR_KINDS`).
Refusals cross as their class, so a permanent one stays permanent and a retryable one keeps
its RetryInfo delay.
"""

from __future__ import annotations

import socket
import struct

from fleetlens.collector.errors import (
    ExportError,
    InvalidRequest,
    LengthRequired,
    Overloaded,
    PermanentError,
    RetryableError,
    StorageFailure,
    TooLarge,
    Unauthenticated,
    UnsupportedMedia,
)

REQUEST_HEAD = struct.Struct("<IBBH")
REPLY_HEAD = struct.Struct("<IBB")
OK, REFUSED = 0, 1
TRANSPORTS = ("grpc", "http")
#: Every refusal class a worker may raise; a subclass crosses as its nearest listed base.
ERROR_KINDS: tuple[type[ExportError], ...] = (
    InvalidRequest, Unauthenticated, TooLarge, UnsupportedMedia, LengthRequired,
    Overloaded, StorageFailure, PermanentError, RetryableError, ExportError)
_KIND_OF = {cls: i for i, cls in enumerate(ERROR_KINDS)}


def recv_exact(sock: socket.socket, size: int) -> bytes:
    """Exactly ``size`` bytes from ``sock``.

    Raises:
        EOFError: the other side closed the connection first.
    """
    buf = bytearray(size)
    view, got = memoryview(buf), 0
    while got < size:
        n = sock.recv_into(view[got:])
        if not n:
            raise EOFError("peer worker closed the connection")
        got += n
    return bytes(buf)


def request_frame(code: int, transport: str, peer: str | None, size: int) -> bytes:
    """The head of a request frame (the payload follows it)."""
    name = (peer or "").encode("utf-8", "replace")[:1024]
    return REQUEST_HEAD.pack(size, code, TRANSPORTS.index(transport), len(name)) + name


def read_request(sock: socket.socket, max_bytes: int) -> tuple[int, str, str | None, bytes]:
    """(signal code, transport, peer, payload) of the next request frame.

    Raises:
        EOFError: the connection ended (between frames: the peer is done).
        ValueError: the frame is not one a worker sends (the connection is dropped).
    """
    size, code, transport, name_len = REQUEST_HEAD.unpack(recv_exact(sock, REQUEST_HEAD.size))
    # max_request_bytes already bounds what the sender took; a bigger frame is not ours.
    if size > max_bytes or transport >= len(TRANSPORTS):
        raise ValueError(f"bad balance frame ({size} bytes, transport {transport})")
    peer = recv_exact(sock, name_len).decode("utf-8", "replace") if name_len else None
    return code, TRANSPORTS[transport], peer, recv_exact(sock, size)


def reply_ok(response: bytes) -> bytes:
    return REPLY_HEAD.pack(len(response), OK, 0) + response


def reply_refused(error: ExportError) -> bytes:
    kind = next(_KIND_OF[cls] for cls in type(error).__mro__ if cls in _KIND_OF)
    message = (str(error) or type(error).__name__).encode("utf-8", "replace")
    return REPLY_HEAD.pack(len(message), REFUSED, kind) + message


def read_reply(sock: socket.socket) -> bytes:
    """The response bytes of the reply to a request sent on ``sock``.

    Raises:
        ExportError: the worker refused the request (same class as there).
        EOFError, OSError: the worker went away before it answered.
    """
    size, status, kind = REPLY_HEAD.unpack(recv_exact(sock, REPLY_HEAD.size))
    body = recv_exact(sock, size)
    if status == OK:
        return body
    raise ERROR_KINDS[min(kind, len(ERROR_KINDS) - 1)](body.decode("utf-8", "replace"))
