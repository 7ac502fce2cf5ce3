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
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from fleetlens.pipeline.schema import attributes as a

#: Deepest array/kvlist nesting kept; deeper values reject their span or point.
MAX_DEPTH = 16
#: Messages kept per request for the partial-success ``error_message``.
MAX_MESSAGES = 5
#: Bucket that takes new service/host names once the per-window cap is reached.
OVERFLOW_NAME = "__overflow__"
BYTES_KEY = "bytes_b64"

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


def dumps(value: Any) -> str:
    """Compact JSON text (UTF-8 kept as is)."""
    if _c_encode is None:
        return _ENCODER.encode(value)
    return "".join(_c_encode(value, 0))


@dataclass
class Limits:
    """The validation limits of one decode call.

    Attributes:
        now_ns: the receive time; timestamps must lie within ``skew_ns`` of it.
        skew_ns: accepted distance of timestamps from ``now_ns``.
        max_attributes: attributes kept per map; the rest are dropped and counted.
        max_value_bytes: longest string value kept (UTF-8 bytes); longer ones are cut.
    """

    now_ns: int
    skew_ns: int
    max_attributes: int
    max_value_bytes: int
    truncated: int = 0

    def __post_init__(self) -> None:
        # Precomputed bounds for the decoders' fast paths.
        self.earliest_ns = self.now_ns - self.skew_ns
        self.latest_ns = self.now_ns + self.skew_ns
        #: Strings up to this many characters can never exceed ``max_value_bytes``.
        self.short_text = self.max_value_bytes // 4

    def check_time(self, ts_ns: int, what: str) -> None:
        """Reject a zero timestamp or one further than the skew from now."""
        if ts_ns <= 0:
            raise Reject(f"{what} is zero")
        if abs(ts_ns - self.now_ns) > self.skew_ns:
            raise Reject(f"{what} {ts_ns} is more than {self.skew_ns // 10**9} s from now")

    def text(self, value: str) -> str:
        """``value`` cut to ``max_value_bytes`` UTF-8 bytes (counted in ``truncated``)."""
        if len(value) <= self.short_text:
            return value
        raw = value.encode("utf-8")
        if len(raw) <= self.max_value_bytes:
            return value
        self.truncated += 1
        return raw[: self.max_value_bytes].decode("utf-8", "ignore")


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
        return [any_value(v, limits, depth + 1) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value, limits, depth + 1) for kv in value.kvlist_value.values}
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
        out[kv.key] = any_value(kv.value, limits)
    return out, 0


def hex_id(raw: bytes, size: int, what: str, *, optional: bool = False) -> str:
    """Lowercase hex of an id of ``size`` bytes, not all zero ("" for an empty optional id)."""
    if not raw and optional:
        return ""
    if len(raw) != size:
        raise Reject(f"{what} must be {size} bytes, got {len(raw)}")
    if not any(raw):
        raise Reject(f"{what} is all zero")
    return raw.hex()


class NameLimiter:
    """Caps distinct service/host names per time window; later new names share one bucket."""

    def __init__(self, max_names: int, window_s: float = 3600.0) -> None:
        self.max_names = max_names
        self.window_s = window_s
        self._seen: set[str] = set()
        self._window_start = time.monotonic()
        self._lock = threading.Lock()
        self.overflowed = 0

    def admit(self, name: str) -> str:
        """``name`` itself, or :data:`OVERFLOW_NAME` when the window is full."""
        if name in self._seen:
            return name
        with self._lock:
            if time.monotonic() - self._window_start > self.window_s:
                self._seen.clear()
                self._window_start = time.monotonic()
            if len(self._seen) < self.max_names:
                self._seen.add(name)
                return name
            self.overflowed += 1
            return OVERFLOW_NAME


@dataclass
class Resource:
    """The decoded resource of one ResourceSpans/ResourceMetrics/ResourceLogs."""

    json: str
    service_name: str
    host_name: str


def decode_resource(resource: Any, limits: Limits, names: NameLimiter) -> Resource:
    """Resource attributes as JSON plus the capped ``service.name`` and ``host.name``."""
    attrs, _ = attribute_map(resource.attributes, limits)
    service = attrs.get(a.SERVICE_NAME)
    host = attrs.get(a.HOST_NAME)
    return Resource(
        json=dumps(attrs),
        service_name=names.admit(service) if isinstance(service, str) else "",
        host_name=names.admit(host) if isinstance(host, str) else "",
    )


@dataclass
class Outcome:
    """What one decode call accepted and rejected."""

    columns: dict[str, list[Any]]
    rows: int = 0
    rejected: int = 0
    messages: list[str] = field(default_factory=list)
    truncated: int = 0

    def reject(self, where: str, error: Reject) -> None:
        """Count one rejected item, keeping the first few reasons for the response."""
        self.rejected += 1
        if len(self.messages) < MAX_MESSAGES:
            self.messages.append(f"{where}: {error}")

    @property
    def error_message(self) -> str:
        """The partial-success message ("" when nothing was rejected)."""
        if not self.rejected:
            return ""
        more = self.rejected - len(self.messages)
        tail = f" (and {more} more)" if more > 0 else ""
        return f"rejected {self.rejected}: " + "; ".join(self.messages) + tail
