"""OTLP/HTTP request framing and body decoding, independent of the server that reads bytes.

What a request must look like before its body is decoded: a media type the collector speaks
(matched case-insensitively, as RFC 9110 says media types are), a known ``Content-Encoding``,
exactly one way of framing the body (``Content-Length`` digits only, or chunked, never both:
a request with both is how request smuggling starts), and a gzip body that is whole: every
member inflated (``gzip`` concatenates members; a decoder that stops after the first drops
rows), nothing after the last member, and never more than ``limit`` bytes produced.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

from fleetlens.collector.errors import InvalidRequest, LengthRequired, UnsupportedMedia

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
IDENTITY = "identity"
GZIP = "gzip"
_GZIP_MAGIC = b"\x1f\x8b"


def media_type(content_type: str | None) -> str:
    """The lower-cased media type of a ``Content-Type`` value, without parameters."""
    return (content_type or "").split(";", 1)[0].strip().lower()


def check_media(content_type: str | None) -> bool:
    """Whether the body is OTLP/JSON (True) or protobuf (False).

    Raises:
        UnsupportedMedia: any other media type (HTTP 415).
    """
    kind = media_type(content_type)
    if kind not in (PROTOBUF, JSON):
        raise UnsupportedMedia(f"unsupported Content-Type {kind!r}; use {PROTOBUF} or {JSON}")
    return kind == JSON


def check_encoding(content_encoding: str | None) -> str:
    """``identity`` or ``gzip`` (case-insensitive).

    Raises:
        UnsupportedMedia: any other encoding, or a list of several (HTTP 415).
    """
    encoding = (content_encoding or IDENTITY).strip().lower()
    if encoding not in (IDENTITY, GZIP):
        raise UnsupportedMedia(f"unsupported Content-Encoding {encoding!r}; use gzip or none")
    return encoding


def check_framing(content_length: list[str], transfer_encoding: list[str]) -> int | None:
    """The declared body length, or None for a chunked body.

    Args:
        content_length: every ``Content-Length`` value of the request.
        transfer_encoding: every ``Transfer-Encoding`` value of the request.

    Raises:
        InvalidRequest: both headers, or a length that is not plain digits (``+5``, ``1_0``,
            ``-1``, ``0x10``: Python's ``int()`` takes the first two) or several that differ.
        LengthRequired: neither header (HTTP 411).
    """
    if content_length and transfer_encoding:
        raise InvalidRequest("Content-Length together with Transfer-Encoding is refused")
    if transfer_encoding:
        return None
    if not content_length:
        raise LengthRequired("Content-Length or Transfer-Encoding: chunked is required")
    values = {value.strip() for value in content_length}
    value = values.pop()
    if values or not value.isascii() or not value.isdigit():
        raise InvalidRequest(f"bad Content-Length {', '.join(content_length)!r}")
    return int(value)


def inflate(body: bytes, limit: int, check_size: Callable[[int], None]) -> bytes:
    """gzip-decompress every member of ``body``, never producing more than ``limit`` bytes.

    Args:
        body: the gzip stream (one or more members).
        limit: the most bytes to inflate; ``check_size`` is called past it.
        check_size: raises (``TooLarge``) for a size over the limit.

    Raises:
        InvalidRequest: corrupt or truncated gzip, or bytes after the last member that do
            not start another member.
    """
    out = bytearray()
    rest = body
    while True:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out += inflater.decompress(rest, limit + 1 - len(out))
        except zlib.error as exc:
            raise InvalidRequest(f"bad gzip body: {exc}") from None
        check_size(len(out))
        if not inflater.eof:  # (had the bound stopped it, check_size would have raised)
            raise InvalidRequest("truncated gzip body")
        rest = inflater.unused_data
        if not rest:
            return bytes(out)
        if not rest.startswith(_GZIP_MAGIC):
            raise InvalidRequest(f"{len(rest)} bytes of trailing garbage after the gzip body")


#: Most lines in a request head. h11 parses a head in one go: 12,900 tiny headers (under the
#: 64 KiB head limit) cost 29 ms, 50x a plain request, before any token is checked (issue
#: 33). OTLP clients send about ten.
MAX_HEAD_LINES = 128


class TooManyHeaders(Exception):
    """The request head has more than :data:`MAX_HEAD_LINES` lines (a 431, not retried)."""


def check_head_lines(buffered: bytes) -> None:
    """Count the lines of the request head at the start of ``buffered`` (up to its end, if
    it is in) before h11 parses it.

    Raises:
        TooManyHeaders: more than :data:`MAX_HEAD_LINES`.
    """
    end = buffered.find(b"\r\n\r\n")
    if buffered.count(b"\n", 0, end if end >= 0 else len(buffered)) > MAX_HEAD_LINES:
        raise TooManyHeaders
