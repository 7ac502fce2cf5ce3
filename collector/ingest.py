"""The thin path shared by both receivers: bytes -> decode -> validate -> WAL -> response.

Receivers hand over the raw protobuf bytes (gRPC never deserializes for us, so garbage is
answered INVALID_ARGUMENT instead of INTERNAL) and turn :class:`ExportError` into wire codes.
"""

from __future__ import annotations

import hmac
import threading
import time
from typing import Any

from fleetlens.collector.balance import Balancer
from fleetlens.collector.config import CollectorConfig
from fleetlens.collector.decode_common import Limits, Outcome
from fleetlens.collector.errors import (
    ExportError,
    InvalidRequest,
    Overloaded,
    TooLarge,
    Unauthenticated,
)
from fleetlens.collector.name_budget import NameLimiter
from fleetlens.collector.rows import table_bytes, to_table
from fleetlens.collector.signals import BY_CODE, Signal
from fleetlens.collector.sink import Sink
from fleetlens.collector.telemetry import REFUSED_OF, Telemetry
from fleetlens.collector.wal import Record

BEARER = "bearer "
#: Exports one worker parses and decodes at once (the rest wait, holding only their bytes):
#: bounds the decoding memory whatever the threads (gRPC, HTTP, peers' hand-overs).
DECODING_AT_ONCE = 2


class Ingest:
    """Decodes, validates and durably accepts Export requests for one process."""

    def __init__(self, config: CollectorConfig, sink: Sink | None, telemetry: Telemetry) -> None:
        self.config = config
        self.sink = sink
        self.telemetry = telemetry
        self.names = NameLimiter(config.max_names_per_window,
                                 per_request=config.max_new_names_per_request,
                                 per_connection=config.max_new_names_per_connection)
        #: The same budget, apart, for gen_ai.request.model values.
        self.models = NameLimiter(config.max_names_per_window,
                                  per_request=config.max_new_names_per_request,
                                  per_connection=config.max_new_names_per_connection)
        self._tokens = [token.encode() for token in config.auth_tokens]
        self._inflight = 0
        self._idle = threading.Condition()
        self._decoding = threading.BoundedSemaphore(DECODING_AT_ONCE)
        self.closing = False
        #: Set by a worker that shares the work with its peers (collector/balance.py).
        self.balancer: Balancer | None = None

    def drain(self, timeout_s: float) -> bool:
        """Refuse new Exports (retryable) and wait for those in flight; True when idle."""
        with self._idle:
            self.closing = True
            return self._idle.wait_for(lambda: self._inflight == 0, timeout_s)

    def authenticate(self, authorization: str | None) -> None:
        """Check an ``Authorization`` header value against the configured bearer tokens.

        Raises:
            Unauthenticated: tokens are configured and the header does not carry one of
                them (the message never echoes what was sent).
        """
        if not self._tokens:
            return
        value = authorization or ""
        given = value[len(BEARER):].strip().encode() if value.lower().startswith(BEARER) else b""
        # compare_digest against every token: timing does not reveal which one matched.
        if not any([hmac.compare_digest(given, token) for token in self._tokens]):
            self.telemetry.add("unauthenticated_requests")
            raise Unauthenticated("missing or invalid bearer token")

    def check_size(self, size: int) -> None:
        """Refuse a request body larger than ``max_request_bytes`` (permanent, no retry)."""
        if size > self.config.max_request_bytes:
            self.telemetry.add("oversize_requests")
            raise TooLarge(f"request of {size} bytes exceeds the limit of "
                           f"{self.config.max_request_bytes} bytes")

    def parse(self, signal: Signal, payload: bytes) -> Any:
        """Parse protobuf bytes, answering INVALID_ARGUMENT for anything undecodable."""
        self.check_size(len(payload))
        try:
            return signal.request.FromString(payload)
        except Exception as exc:  # DecodeError, RecursionError, invalid UTF-8 ...
            self.telemetry.add("invalid_requests")
            raise InvalidRequest(f"undecodable {signal.folder} request: {exc}") from None

    def known_fields(self, request: Any, payload: bytes, *, known_dirty: bool = False) -> bytes:
        """``payload`` without fields the OTLP schema does not know (what the WAL stores).

        Unknown fields are never decoded, so storing them would only spend WAL and replay
        work on bytes a client chose freely. When the size is unchanged after dropping them
        there were none (the common case: no re-encoding). ``known_dirty``: the decoder
        already found some (spans, whose decoder checks more cheaply; see decode_spans).
        """
        request.DiscardUnknownFields()
        if not known_dirty and request.ByteSize() == len(payload):
            return payload
        self.telemetry.add("unknown_field_requests")
        return request.SerializeToString()

    def limits(self, received_ns: int) -> Limits:
        """The validation limits of one request received at ``received_ns`` (benchmarks
        that call a decoder directly take them from here too)."""
        cfg = self.config
        return Limits(now_ns=received_ns, skew_ns=int(cfg.max_clock_skew_s * 1e9),
                      future_ns=int(cfg.max_future_skew_s * 1e9),
                      max_attributes=cfg.max_attributes,
                      max_value_bytes=cfg.max_attribute_value_bytes,
                      max_key_bytes=cfg.max_attribute_key_bytes,
                      max_list_items=cfg.max_attribute_list_items,
                      max_name_bytes=cfg.max_name_bytes,
                      max_resource_bytes=cfg.max_resource_bytes)

    def decode(self, signal: Signal, request: Any, received_ns: int,
               payload: bytes | None = None, peer: str | None = None) -> Outcome:
        """Validate and convert a parsed request; timestamps are judged against receipt.

        ``payload``, the bytes ``request`` was parsed from, lets a decoder that reads the
        bytes too (spans) skip re-encoding the request. ``peer`` names the connection for
        its budget of new service/host names.
        """
        limits = self.limits(received_ns)
        before = self.names.overflowed + self.models.overflowed
        names = self.names.for_request(peer, self.models)
        if payload is not None and signal.reads_payload:
            outcome = signal.decode(request, limits, names, received_ns, payload)
        else:
            outcome = signal.decode(request, limits, names, received_ns)
        if outcome.truncated:
            self.telemetry.add("truncated_values", outcome.truncated)
        after = self.names.overflowed + self.models.overflowed
        if after != before:
            self.telemetry.add("overflow_names", after - before)
        return outcome

    def export(self, signal: Signal, payload: bytes, request: Any = None,
               peer: str | None = None, transport: str = "http", *,
               here: bool = False) -> Any:
        """Handle one Export: returns the response message once the rows are durable.

        Args:
            signal: which service was called.
            payload: the request as protobuf bytes (what the WAL stores).
            request: the parsed request when the receiver already has it (OTLP/JSON).
            peer: the client connection (gRPC ``context.peer()``), for per-connection
                budgets; None when unknown.
            transport: the receiver (``grpc`` or ``http``), for the item counters.
            here: run it in this process (a peer worker handed it over); otherwise a
                protobuf request may be handed to a worker running fewer Exports.

        Raises:
            ExportError: the request is refused as a whole.
        """
        with self._idle:
            if self.closing:
                raise Overloaded("collector is shutting down; retry")
            self._inflight += 1
        try:
            balancer = self.balancer
            if balancer is None:
                return self._export(signal, payload, request, peer, transport)
            if request is None and not here:  # OTLP/JSON is parsed already: decoded here
                target = balancer.pick()
                if target is not None:
                    answer = balancer.send(target, signal.code, transport, peer, payload)
                    if answer is not None:
                        self.telemetry.add("balanced_exports")
                        return signal.response.FromString(answer)
            with balancer.running():
                return self._export(signal, payload, request, peer, transport)
        finally:
            with self._idle:
                self._inflight -= 1
                self._idle.notify_all()

    def export_for_peer(self, code: int, transport: str, peer: str | None,
                        payload: bytes) -> bytes:
        """An Export another worker handed over (collector/balance.py): the response bytes.

        Raises:
            ExportError: refused, exactly as for a connection of this worker.
        """
        signal = BY_CODE.get(code)
        if signal is None:
            raise InvalidRequest(f"unknown signal code {code}")
        return self.export(signal, payload, peer=peer, transport=transport,
                           here=True).SerializeToString()

    def _export(self, signal: Signal, payload: bytes, request: Any, peer: str | None,
                transport: str) -> Any:
        started = time.perf_counter()
        # The parse, decode and Arrow steps hold the GIL; more of them at once only
        # interleave, each holding its parsed request (about 3x the payload) meanwhile.
        with self._decoding:
            parsed_here = request is None  # OTLP/JSON requests are encoded from known fields
            if parsed_here:
                request = self.parse(signal, payload)
                if not signal.reads_payload:
                    payload = self.known_fields(request, payload)
            received_ns = time.time_ns()
            outcome = self.decode(signal, request, received_ns, payload, peer)
            if parsed_here and outcome.unknown_fields:
                payload = self.known_fields(request, payload, known_dirty=True)
            request = None  # not kept while the WAL fsync is awaited
            try:
                self._check_fits(outcome.shared_chars, "resource and scope text")
                table = to_table(signal, outcome)
                outcome.columns = {}  # the table has the rows; only the counts answer
                self._check_fits(table_bytes(table), "rows")
            except ExportError:  # refused whole after decoding: every item is refused
                self.telemetry.add_items(REFUSED_OF[signal.counter], transport,
                                         outcome.rows + outcome.rejected)
                raise
        try:
            if self.sink is None:
                raise Overloaded("collector is starting; retry")
            self.sink.accept(signal, received_ns, payload, table)
        except ExportError:  # refused whole after decoding: every item is refused
            self.telemetry.add_items(REFUSED_OF[signal.counter], transport,
                                     outcome.rows + outcome.rejected)
            raise
        self.telemetry.add_items(signal.counter, transport, outcome.rows)
        if outcome.rejected:
            self.telemetry.add("rejected_items", outcome.rejected)
            self.telemetry.add_items(REFUSED_OF[signal.counter], transport, outcome.rejected)
        self.telemetry.observe_export(time.perf_counter() - started)
        return signal.response_for(outcome)

    def _check_fits(self, size: int, what: str) -> None:
        """Refuse, permanently, a request whose rows could never fit the buffer: answering
        "buffer full, retry" would make its client retry the same bytes forever."""
        if size > self.config.max_buffered_bytes:
            self.telemetry.add("oversize_requests")
            raise TooLarge(f"request expands to {size} bytes of {what}, more than the "
                           f"buffer of {self.config.max_buffered_bytes} bytes can ever hold")

    def replay_table(self, record: Record) -> tuple[Signal, Any]:
        """Rows of a WAL record, decoded exactly as when it was first received."""
        signal = BY_CODE[record.signal]
        request = signal.request.FromString(record.payload)
        outcome = self.decode(signal, request, record.received_ns, record.payload)
        return signal, to_table(signal, outcome)
