"""Shared pieces of OTLP decoding: AnyValue to JSON values, limits, rejection bookkeeping.

Conventions (TEAM.md): attribute maps become JSON objects stored as strings; an AnyValue
string stays a string, bool a bool, int an int, double a float (non-finite doubles become the
strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` because JSON has no such numbers), array a
list, kvlist an object and bytes ``{"bytes_b64": "..."}``.
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema import columns as c

if TYPE_CHECKING:  # name_budget imports OVERFLOW_NAME from here
    from fleetlens.collector.name_budget import NameLimiter, RequestNames

#: Deepest array/kvlist nesting kept; deeper values reject their span or point.
MAX_DEPTH = 16
#: Messages kept per request for the partial-success ``error_message``.
MAX_MESSAGES = 5
#: Bucket that takes new service/host names once the per-window cap is reached.
OVERFLOW_NAME = "__overflow__"
BYTES_KEY = a.ANY_VALUE_BYTES_KEY

_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
# The C encoder built once: JSONEncoder.encode builds it anew on every call (about 0.8 us, a
# third of encoding a span's attributes). markers=None skips the circular-reference check,
# which decoded protobuf values (trees, depth-limited) never need. Same output as _ENCODER.
_c_encode = json.encoder.c_make_encoder(
    None, _ENCODER.default, json.encoder.encode_basestring, None, ":", ",", False, False, False,
) if json.encoder.c_make_encoder is not None else None
EMPTY_OBJECT = "{}"


class Reject(Exception):
    """One span, point or log record is invalid; the message says why."""


#: What rejects one item. Besides :class:`Reject`, a value that cannot be converted (a
#: ValueError or OverflowError the explicit checks did not foresee) is that item's fault:
#: letting it escape would fail the whole Export, which is answered as retryable.
ITEM_ERRORS: tuple[type[Exception], ...] = (Reject, ValueError, OverflowError)


def dumps(value: Any) -> str:
    """Compact JSON text (UTF-8 kept as is)."""
    if _c_encode is None:
        return _ENCODER.encode(value)
    return "".join(_c_encode(value, 0))


#: Largest value a signed 64-bit Arrow column holds (OTLP counts are uint64).
INT64_MAX = (1 << 63) - 1


@dataclass
class Limits:
    """The validation limits of one decode call.

    Attributes:
        now_ns: the receive time; timestamps must lie within ``skew_ns`` before it and
            ``future_ns`` after it.
        skew_ns: accepted age of timestamps.
        max_attributes: attributes kept per map; the rest are dropped and counted.
        max_value_bytes: longest string value kept (UTF-8 bytes); longer ones are cut.
        future_ns: accepted distance of timestamps ahead of ``now_ns`` (``skew_ns`` if None).
        max_key_bytes: longest attribute key kept; longer keys are cut.
        max_list_items: array elements kept per array value; the rest are dropped.
        max_name_bytes: longest name-like field kept (trace_state, scope name and version,
            schema URLs, units, severity text); longer ones are cut.
        max_resource_bytes: largest resource or scope attribute JSON; attributes past it are
            dropped, because that text is repeated on every row of the resource.
    """

    now_ns: int
    skew_ns: int
    max_attributes: int
    max_value_bytes: int
    future_ns: int | None = None
    max_key_bytes: int = 256
    max_list_items: int = 1024
    max_name_bytes: int = 1024
    max_resource_bytes: int = 16 * 1024
    truncated: int = 0
    #: Set by a decoder that found protobuf fields the schema does not know (or a
    #: non-canonical encoding): the WAL then stores the request re-encoded without them.
    unknown_fields: bool = False

    def __post_init__(self) -> None:
        if self.future_ns is None:
            self.future_ns = self.skew_ns
        # Precomputed bounds for the decoders' fast paths.
        self.earliest_ns = self.now_ns - self.skew_ns
        self.latest_ns = self.now_ns + self.future_ns
        #: Strings up to this many characters can never exceed ``max_value_bytes``.
        self.short_text = self.max_value_bytes // 4
        self.short_key = self.max_key_bytes // 4
        self.short_name = self.max_name_bytes // 4

    def check_time(self, ts_ns: int, what: str) -> None:
        """Reject a zero timestamp, one older than the skew or further ahead than the
        future bound (a clock running ahead must not move the pipeline's watermarks)."""
        if ts_ns <= 0:
            raise Reject(f"{what} is zero")
        if ts_ns < self.earliest_ns:
            raise Reject(f"{what} {ts_ns} is more than {self.skew_ns // 10**9} s from now "
                         "(in the past)")
        if ts_ns > self.latest_ns:
            raise Reject(f"{what} {ts_ns} is more than {self.future_ns // 10**9} s from now "
                         "(in the future)")

    def text(self, value: str) -> str:
        """``value`` cut to ``max_value_bytes`` UTF-8 bytes (counted in ``truncated``)."""
        if len(value) <= self.short_text:
            return value
        return self._cut(value, self.max_value_bytes)

    def key(self, value: str) -> str:
        """An attribute key cut to ``max_key_bytes`` UTF-8 bytes."""
        if len(value) <= self.short_key:
            return value
        return self._cut(value, self.max_key_bytes)

    def name(self, value: str) -> str:
        """A name-like field (trace_state, scope name, schema URL) cut to ``max_name_bytes``."""
        if len(value) <= self.short_name:
            return value
        return self._cut(value, self.max_name_bytes)

    def _cut(self, value: str, limit: int) -> str:
        raw = value.encode("utf-8")
        if len(raw) <= limit:
            return value
        self.truncated += 1
        return raw[:limit].decode("utf-8", "ignore")


def check_count(value: int, what: str) -> int:
    """``value`` when it fits an int64 column; a larger uint64 count rejects its item."""
    if value > INT64_MAX:
        raise Reject(f"{what} {value} does not fit a signed 64-bit integer")
    return value


def finite(value: float) -> float | str:
    """A double for JSON: non-finite ones as the strings ``"NaN"``, ``"Infinity"``..."""
    return value if math.isfinite(value) else json.dumps(value)


def any_value(value: Any, limits: Limits, depth: int = 0) -> Any:
    """Convert one OTLP ``AnyValue`` into a JSON-able Python value."""
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return limits.text(value.string_value)
    if kind == "int_value":
        return value.int_value
    if kind == "double_value":
        number = value.double_value
        return number if math.isfinite(number) else json.dumps(number)
    if kind == "bool_value":
        return value.bool_value
    if kind is None:
        return None
    if depth >= MAX_DEPTH:
        raise Reject(f"attribute value nested deeper than {MAX_DEPTH}")
    if kind == "array_value":
        values = value.array_value.values
        if len(values) > limits.max_list_items:
            limits.truncated += 1
            values = values[:limits.max_list_items]
        return [any_value(v, limits, depth + 1) for v in values]
    if kind == "kvlist_value":
        entries = value.kvlist_value.values
        if len(entries) > limits.max_attributes:
            limits.truncated += 1
            entries = entries[:limits.max_attributes]
        return {limits.key(kv.key): any_value(kv.value, limits, depth + 1) for kv in entries}
    # bytes_value
    raw = value.bytes_value[: limits.max_value_bytes]
    return {BYTES_KEY: base64.b64encode(raw).decode("ascii")}


def attribute_map(kvs: Any, limits: Limits) -> tuple[dict[str, Any], int]:
    """A KeyValue list as a dict, keeping at most ``max_attributes``; returns (map, dropped)."""
    out: dict[str, Any] = {}
    for kv in kvs:
        if len(out) >= limits.max_attributes:
            limits.truncated += 1
            return out, len(kvs) - limits.max_attributes
        out[limits.key(kv.key)] = any_value(kv.value, limits)
    return out, 0


def bounded_json(attrs: dict[str, Any], limits: Limits, keep: tuple[str, ...] = ()) -> str:
    """A resource or scope attribute map as JSON of at most ``max_resource_bytes`` bytes.

    The collector buffers that text once per request (``collector.rows``), but the pipeline
    and readers get it on every row of the resource: attributes that do not fit are dropped
    (counted in ``truncated``), the ``keep`` keys (service and host name) first kept.
    """
    text = dumps(attrs)
    if len(text) <= limits.max_resource_bytes // 4 or \
            len(text.encode("utf-8")) <= limits.max_resource_bytes:
        return text
    budget = limits.max_resource_bytes - 2  # the braces
    kept: dict[str, Any] = {}
    order = [k for k in keep if k in attrs] + [k for k in attrs if k not in keep]
    for key in order:
        size = len(dumps({key: attrs[key]}).encode("utf-8")) - 1  # the pair and a comma
        if size <= budget:
            kept[key] = attrs[key]
            budget -= size
        else:
            limits.truncated += 1
    return dumps(kept)


def hex_id(raw: bytes, size: int, what: str, *, optional: bool = False) -> str:
    """Lowercase hex of an id of ``size`` bytes, not all zero ("" for an empty optional id)."""
    if not raw and optional:
        return ""
    if len(raw) != size:
        raise Reject(f"{what} must be {size} bytes, got {len(raw)}")
    if not any(raw):
        raise Reject(f"{what} is all zero")
    return raw.hex()


@dataclass
class Resource:
    """The decoded resource of one ResourceSpans/ResourceMetrics/ResourceLogs."""

    json: str
    service_name: str
    host_name: str


def decode_resource(resource: Any, limits: Limits,
                    names: NameLimiter | RequestNames) -> Resource:
    """Resource attributes as JSON plus the capped ``service.name`` and ``host.name``."""
    attrs, _ = attribute_map(resource.attributes, limits)
    service = attrs.get(a.SERVICE_NAME)
    host = attrs.get(a.HOST_NAME)
    return Resource(
        json=bounded_json(attrs, limits, (a.SERVICE_NAME, a.HOST_NAME)),
        service_name=names.admit(service) if isinstance(service, str) else "",
        host_name=names.admit(host) if isinstance(host, str) else "",
    )


#: Columns whose value is the same on every row of one resource or scope: buffered as
#: dictionaries (``collector.rows``), each distinct text once per request.
SHARED_COLUMNS = frozenset({
    c.SERVICE_NAME, c.HOST_NAME, c.RESOURCE_ATTRIBUTES, c.RESOURCE_SCHEMA_URL,
    c.SCOPE_NAME, c.SCOPE_VERSION, c.SCOPE_ATTRIBUTES, c.SCOPE_SCHEMA_URL,
})
#: Bytes a row spends on one :data:`SHARED_COLUMNS` value: its int32 dictionary index.
SHARED_INDEX_BYTES = 4


def shared_chars(shared: dict[str, Any]) -> int:
    """What one row's copy of ``shared`` (the per-resource columns) costs in the buffer.

    Text of :data:`SHARED_COLUMNS` is stored once per request, not per row (the table's
    bytes count it), so a row pays only the index; other text (a metric's name and
    description) is copied onto each row and counts in characters.
    """
    return sum(SHARED_INDEX_BYTES if k in SHARED_COLUMNS else len(v)
               for k, v in shared.items() if isinstance(v, str))


@dataclass
class Outcome:
    """What one decode call accepted and rejected."""

    columns: dict[str, list[Any]]
    rows: int = 0
    rejected: int = 0
    messages: list[str] = field(default_factory=list)
    truncated: int = 0
    #: Buffer bytes of the per-resource columns over all rows (see :func:`shared_chars`).
    shared_chars: int = 0
    #: The request holds unknown fields the decoder noticed (see ``Limits.unknown_fields``).
    unknown_fields: bool = False

    def reject(self, where: str, error: Exception) -> None:
        """Count one rejected item, keeping the first few reasons for the response."""
        self.rejected += 1
        if len(self.messages) < MAX_MESSAGES:
            kind = "" if isinstance(error, Reject) else f"{type(error).__name__}: "
            self.messages.append(f"{where}: {kind}{error}")

    def add(self, row: dict[str, Any], shared: dict[str, Any], shared_bytes: int) -> None:
        """Append one accepted row (its own fields, then the resource's ``shared`` ones, which
        weigh ``shared_bytes`` in buffers: see :func:`shared_chars`)."""
        row.update(shared)
        for name, column in self.columns.items():
            column.append(row.get(name))
        self.rows += 1
        self.shared_chars += shared_bytes

    @property
    def error_message(self) -> str:
        """The partial-success message ("" when nothing was rejected)."""
        if not self.rejected:
            return ""
        more = self.rejected - len(self.messages)
        tail = f" (and {more} more)" if more > 0 else ""
        return f"rejected {self.rejected}: " + "; ".join(self.messages) + tail
