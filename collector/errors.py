"""Every way an Export can fail, and what each means on the wire.

The hierarchy follows the OpenTelemetry Collector's ``consumererror``: an error is either
*permanent* (the client must not retry: the same bytes will fail again) or *retryable*
(the collector is busy or its disk failed: the client should retry later)::

    ExportError
    ├── PermanentError
    │   ├── InvalidRequest       INVALID_ARGUMENT    / HTTP 400  (undecodable body, bad JSON)
    │   ├── Unauthenticated      UNAUTHENTICATED     / HTTP 401  (missing or wrong bearer token)
    │   ├── TooLarge             RESOURCE_EXHAUSTED  / HTTP 413  (no RetryInfo: do not retry)
    │   ├── UnsupportedMedia     INVALID_ARGUMENT    / HTTP 415
    │   └── LengthRequired       INVALID_ARGUMENT    / HTTP 411  (no Content-Length)
    └── RetryableError
        ├── Overloaded           UNAVAILABLE + RetryInfo / HTTP 503 + Retry-After
        └── StorageFailure       UNAVAILABLE + RetryInfo / HTTP 503 (disk full, WAL failure)

Receivers catch :class:`ExportError` only; anything else is a bug and is answered as a
retryable UNAVAILABLE (never OK), so no acknowledged data depends on a code path that raised.
"""

from __future__ import annotations

import grpc
from google.protobuf.duration_pb2 import Duration
from google.rpc.error_details_pb2 import RetryInfo

#: Trailer that carries a serialized ``google.rpc.RetryInfo`` (OTLP spec, "Throttling").
RETRY_INFO_KEY = "google.rpc.retryinfo-bin"


class ExportError(Exception):
    """Base class: an Export that is refused as a whole."""

    grpc_code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE
    http_status: int = 503
    #: Seconds a client should wait before retrying; ``None`` means "do not retry".
    retry_after_s: float | None = None


class PermanentError(ExportError):
    """The request itself is bad: retrying the same bytes cannot succeed."""

    grpc_code = grpc.StatusCode.INVALID_ARGUMENT
    http_status = 400


class InvalidRequest(PermanentError):
    """The body is not a decodable OTLP request."""


class UnsupportedMedia(PermanentError):
    """OTLP/HTTP body with a content type or encoding the collector does not speak."""

    http_status = 415


class LengthRequired(PermanentError):
    """OTLP/HTTP body without a Content-Length (chunked bodies are not accepted)."""

    http_status = 411


class Unauthenticated(PermanentError):
    """Missing or wrong bearer token. The message never contains the token."""

    grpc_code = grpc.StatusCode.UNAUTHENTICATED
    http_status = 401


class TooLarge(PermanentError):
    """The request (after decompression) exceeds ``max_request_bytes``."""

    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED
    http_status = 413


class RetryableError(ExportError):
    """The collector cannot take the request now; the same bytes may succeed later."""

    grpc_code = grpc.StatusCode.UNAVAILABLE
    http_status = 503
    retry_after_s = 1.0


class Overloaded(RetryableError):
    """Buffers or in-flight limits are full (backpressure)."""


class StorageFailure(RetryableError):
    """The write-ahead log could not be written or synced (disk full, I/O error)."""

    retry_after_s = 5.0


def retry_info_trailer(seconds: float) -> tuple[tuple[str, bytes], ...]:
    """The gRPC trailing metadata that tells OTLP clients how long to back off."""
    whole = int(seconds)
    delay = Duration(seconds=whole, nanos=int((seconds - whole) * 1e9))
    return ((RETRY_INFO_KEY, RetryInfo(retry_delay=delay).SerializeToString()),)


def abort_grpc(context: grpc.ServicerContext, error: ExportError) -> None:
    """Answer a gRPC call with ``error``'s code (and RetryInfo when retryable); never returns."""
    if error.retry_after_s is not None:
        context.set_trailing_metadata(retry_info_trailer(error.retry_after_s))
    context.abort(error.grpc_code, str(error) or type(error).__name__)


def http_headers(error: ExportError) -> dict[str, str]:
    """Extra HTTP response headers for ``error`` (``Retry-After`` when retryable)."""
    if error.retry_after_s is None:
        return {}
    return {"Retry-After": str(max(1, round(error.retry_after_s)))}
