"""The edge collector's OTLP/gRPC client to the central collector, and what each answer means.

An edge never drops what it acknowledged because the link or the central side is unwell, so
the classification is stricter than the OTLP client rules: only an answer that blames the
*bytes* (INVALID_ARGUMENT, or RESOURCE_EXHAUSTED without RetryInfo: too large), sent by the
central collector, is permanent. A status gRPC made up on the edge's side ("CLIENT: Received
message larger than max" when the *answer* is too large, after the central collector stored
the data) says nothing about the bytes sent: retried. Even permanent refusals stop being
believed after ``forward.max_refused_in_a_row`` in a row (:mod:`.forward_health`).
Answers that blame the setup (UNAUTHENTICATED, PERMISSION_DENIED, UNIMPLEMENTED, a bad
certificate) are retried, slowly and loudly, until someone fixes it: the WAL keeps the data,
and its bound refuses new Exports once it is full.
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from fleetlens.collector.config import ForwardConfig
from fleetlens.collector.errors import RETRY_INFO_KEY
from fleetlens.collector.signals import Signal
from fleetlens.collector.telemetry import log
from fleetlens.pipeline.schema.settings import is_loopback

_AUTHORIZATION = "authorization"
#: gRPC's mark on a status its client side made up itself (grpcio >= 1.5x: "CLIENT: ..."). A
#: central collector could send the mark too: that only makes its refusal a retry (safe).
_CLIENT_SIDE = "CLIENT:"
#: Characters of a central collector's message kept for the log (it is not trusted: a 4 MB
#: partial-success message would otherwise be logged whole, control characters and all).
DETAIL_CHARS = 300
#: Answers about the request bytes themselves: resending them cannot succeed.
_PERMANENT = {grpc.StatusCode.INVALID_ARGUMENT}
#: Answers about the edge's setup (token, certificate, wrong endpoint): retried, logged.
SETUP_CODES = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
               grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.NOT_FOUND,
               grpc.StatusCode.FAILED_PRECONDITION}


class Verdict(enum.Enum):
    """What to do after one forwarded Export."""

    SENT = "sent"  # the central collector made it durable (some items may be rejected)
    RETRY = "retry"  # not stored; send the same bytes again later
    PERMANENT = "permanent"  # these bytes will never be accepted


@dataclass
class Answer:
    """One forwarded Export's outcome."""

    verdict: Verdict
    detail: str = ""
    #: Items the central collector rejected within an accepted request (partial success).
    rejected: int = 0
    code: grpc.StatusCode | None = None


def _read(path: str | None) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise RuntimeError(f"cannot read forward TLS file {path}: {exc.strerror}") from None


def channel_for(config: ForwardConfig) -> grpc.Channel:
    """A channel to ``config.address``: TLS unless ``insecure``; mutual TLS with a cert.

    Raises:
        RuntimeError: a TLS file cannot be read.
    """
    options = [("grpc.max_send_message_length", -1), ("grpc.enable_retries", 0),
               # notice a dead central collector within seconds on an idle link
               ("grpc.keepalive_time_ms", 30_000), ("grpc.keepalive_timeout_ms", 10_000)]
    if config.insecure:
        if not is_loopback(config.address.rpartition(":")[0], resolve=True):
            log.warning("forwarding to %s in plaintext (forward.insecure): telemetry and the "
                        "token cross the network unencrypted", config.address)
        return grpc.insecure_channel(config.address, options=options)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_read(config.ca_file), private_key=_read(config.key_file),
        certificate_chain=_read(config.cert_file))
    return grpc.secure_channel(config.address, credentials, options=options)


def _has_retry_info(error: grpc.RpcError) -> bool:
    trailers = error.trailing_metadata() if hasattr(error, "trailing_metadata") else None
    return any(key == RETRY_INFO_KEY for key, _ in trailers or ())


def classify(error: grpc.RpcError) -> Answer:
    """The verdict for a failed call (see the module docstring)."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    text = str(error.details() if hasattr(error, "details") else error)
    detail = f"{code.name}: {printable(text)}"
    if _CLIENT_SIDE in text:
        return Answer(Verdict.RETRY, detail, code=code)
    if code in _PERMANENT or (code == grpc.StatusCode.RESOURCE_EXHAUSTED
                              and not _has_retry_info(error)):
        return Answer(Verdict.PERMANENT, detail, code=code)
    return Answer(Verdict.RETRY, detail, code=code)


def printable(text: str) -> str:
    """At most :data:`DETAIL_CHARS` of ``text`` for one log line, control characters escaped."""
    head = "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text[:DETAIL_CHARS])
    return head + (f"... ({len(text)} characters)" if len(text) > DETAIL_CHARS else "")


class ForwardClient:
    """Sends Export request bytes to the central collector (one channel, reused)."""

    def __init__(self, config: ForwardConfig) -> None:
        self.config = config
        self.channel = channel_for(config)
        self._metadata = ((_AUTHORIZATION, f"Bearer {config.auth_token}"),) \
            if config.auth_token else None
        self._calls: dict[str, Any] = {}
        self._compression = (grpc.Compression.Gzip if config.compression == "gzip"
                             else grpc.Compression.NoCompression)

    def send(self, signal: Signal, payload: bytes, *, timeout: float | None = None,
             abort: threading.Event | None = None) -> Answer:
        """Export ``payload`` (serialized request bytes) and classify the answer.

        Args:
            timeout: seconds for this call (default ``timeout_s``).
            abort: cancels the call when set (a stopping edge must not sit out a deadline
                against a central collector that does not answer); answered RETRY.
        """
        call = self._calls.get(signal.grpc_method)
        if call is None:
            call = self.channel.unary_unary(signal.grpc_method, request_serializer=None,
                                            response_deserializer=signal.response.FromString)
            self._calls[signal.grpc_method] = call
        future = call.future(payload, timeout=timeout or self.config.timeout_s,
                             metadata=self._metadata, compression=self._compression)
        if abort is not None:
            finished = threading.Event()
            future.add_done_callback(lambda _: finished.set())
            while not finished.wait(0.1):
                if abort.is_set():
                    future.cancel()
                    return Answer(Verdict.RETRY, "cancelled: the collector is stopping")
        try:
            response = future.result()
        except grpc.FutureCancelledError:
            return Answer(Verdict.RETRY, "cancelled: the collector is stopping")
        except grpc.RpcError as error:
            return classify(error)
        partial = response.partial_success
        rejected = getattr(partial, signal.rejected_field)
        return Answer(Verdict.SENT, printable(partial.error_message), rejected=rejected)

    def close(self) -> None:
        self.channel.close()
