"""ExportTraceServiceRequest -> columns of the raw ``spans`` table, span by span validated.

Typed columnar conversion: one pass over the protobuf objects appends to one Python list per
column (no ``MessageToDict``). Promoted gen_ai.* attributes go to their typed columns and stay
out of the ``attributes`` JSON; a promoted key whose value has the wrong type stays in the JSON
and leaves its column null.

Where the C span kernel is built (``collector/span_kernel.py``), it decodes the spans of the
common shape and hands the others back to :func:`_span_row`, which stays the reference.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from typing import Any

from fleetlens.collector import span_kernel
from fleetlens.collector.decode_common import (
    EMPTY_OBJECT,
    ITEM_ERRORS,
    Limits,
    Outcome,
    Reject,
    any_value,
    attribute_map,
    bounded_json,
    decode_resource,
    dumps,
    hex_id,
    shared_chars,
)
from fleetlens.collector.lite_spans import (
    MAX_HEADERS,
    TAG_BOOL,
    TAG_DOUBLE,
    TAG_INT,
    TAG_STRING,
    KeyValue,
    LiteRequest,
    read_header,
    varint,
)
from fleetlens.collector.name_budget import NameLimiter, RequestNames
from fleetlens.collector.span_events import events_json, links_json
from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

SPAN_COLUMNS: tuple[str, ...] = tuple(t.table(t.SPANS).dtypes)
_FLOAT_TYPES = (float, int)
#: promoted key -> (column, accepted Python types of the decoded value)
_PROMOTED: dict[str, tuple[str, tuple[type, ...]]] = {
    key: (col, (str,) if dtype == t.STR else _FLOAT_TYPES if dtype == t.F64 else (int,))
    for key, (col, dtype) in a.PROMOTED_SPAN_ATTRIBUTE_DTYPES.items()
}


#: Per-span columns in the order :func:`_span_row` returns them; promoted columns follow.
_OWN = (c.TRACE_ID, c.SPAN_ID, c.PARENT_SPAN_ID, c.TRACE_STATE, c.FLAGS, c.NAME, c.KIND,
        c.START_NS, c.END_NS, c.STATUS_CODE, c.STATUS_MESSAGE, c.ATTRIBUTES, c.EVENTS, c.LINKS,
        c.DROPPED_ATTRIBUTES_COUNT, c.DROPPED_EVENTS_COUNT, c.DROPPED_LINKS_COUNT)
_PROMOTED_ORDER = tuple(col for col, _ in _PROMOTED.values())
_ROW_COLUMNS = (*_OWN, *_PROMOTED_ORDER)
#: promoted key -> (index in the promoted part of a row, accepted types, is float column)
_PROMOTED_SLOT = {key: (i, types, types is _FLOAT_TYPES)
                  for i, (key, (_, types)) in enumerate(_PROMOTED.items())}
_NO_PROMOTED = (None,) * len(_PROMOTED_ORDER)
#: Encoded KeyValue header (key, value length, scalar tag) -> what :func:`_header` read.
_HEADERS: dict[bytes, tuple] = {}
_NOT_PLAIN = object()
#: (limits, encoded non-promoted attributes) -> (attributes JSON, dropped, truncated).
_JSON_CACHE: dict[tuple[int, int, bytes], tuple[str, int, int]] = {}
_NO_ATTRIBUTES = (EMPTY_OBJECT, 0, 0)
#: Cache bounds: at most 1,024 entries of <= 1 KiB of attributes each (a few MiB at worst).
_JSON_CACHE_MAX_ENTRIES, _JSON_CACHE_MAX_ITEMS, _JSON_CACHE_MAX_KEY_BYTES = 1024, 32, 1024
_KIND_OF_TAG = {TAG_DOUBLE: float, TAG_INT: int, TAG_STRING: str, TAG_BOOL: bool}
_double = struct.Struct("<d").unpack_from


def _header(kvb: bytes) -> tuple | None:
    """Read and remember the header of a plain encoded KeyValue (None when not plain)."""
    head = read_header(kvb)
    if head is None:
        return None
    if len(_HEADERS) >= MAX_HEADERS:
        _HEADERS.clear()  # bounded; refilled by the shapes in use
    key, tag, offset, total = head
    slot = _PROMOTED_SLOT.get(key)
    # target: the promoted column this (key, value kind) always fits (a double must also be
    # finite); a promoted key with a kind that does not fit stays in the JSON.
    kind = _KIND_OF_TAG[tag]
    fits = slot is not None and (kind in (str,) if slot[1] == (str,) else
                                 kind in (float, int) if slot[2] else kind is int)
    entry = (key, tag, offset, total, slot, slot[0] if fits else None,
             bool(fits and slot[2] and kind is int))
    _HEADERS[kvb[:offset]] = entry
    return entry


_EMPTY_LIST = "[]"
_ZERO16, _ZERO8 = bytes(16), bytes(8)


def _plain_value(kvb: bytes, head: tuple, limits: Limits) -> Any:
    """The scalar of a KeyValue with a plain header, or _NOT_PLAIN when its value is not."""
    tag, offset, total = head[1], head[2], head[3]
    if tag == TAG_DOUBLE:
        return _double(kvb, offset)[0]
    if tag == TAG_STRING:
        if kvb[offset] != total - offset - 1:  # not a one-byte length with nothing after
            return _NOT_PLAIN
        value = kvb[offset + 1:].decode("utf-8")
        return value if len(value) <= limits.short_text else limits.text(value)
    first = kvb[offset]
    number = first if total - offset == 1 and first < 0x80 else varint(kvb, offset)
    if number is None:
        return _NOT_PLAIN
    return number if tag == TAG_INT else number != 0


def _full_kv(kvb: bytes, limits: Limits) -> Any:
    """A KeyValue that is not in the plain shape, parsed with the real type.

    Only these can hide unknown protobuf fields (the plain shape is exact, byte for byte), so
    this is where the decoder notices them for span attributes, for the price of a ByteSize on
    the rare non-plain attribute instead of walking every attribute of every request.
    """
    kv = KeyValue.FromString(kvb)
    kv.DiscardUnknownFields()
    if kv.ByteSize() != len(kvb):
        limits.unknown_fields = True
    return kv


def _attributes_json(rest: list[Any], only_bytes: bool, limits: Limits) -> tuple[str, int, int]:
    """The ``attributes`` JSON of the non-promoted attributes, with (dropped, truncated).

    Spans of one client mostly repeat the same non-promoted attributes (vLLM: n, temperature,
    top_p, finish_reasons), so the result is remembered by their encoded bytes.
    """
    cache_key = None
    if only_bytes and len(rest) <= _JSON_CACHE_MAX_ITEMS:
        encoded = b"".join(rest)
        if len(encoded) <= _JSON_CACHE_MAX_KEY_BYTES:  # bounds the cache's memory
            cache_key = (limits.max_attributes, limits.max_value_bytes, encoded)
    if cache_key is not None:
        hit = _JSON_CACHE.get(cache_key)
        if hit is not None:
            return hit
    attrs: dict[str, Any] = {}
    truncated_before = limits.truncated
    max_attributes = limits.max_attributes
    dropped = 0
    for entry in rest:
        if isinstance(entry, bytes):
            head = _HEADERS.get(entry[:entry[1] + 5]) or _header(entry)
            key, value = head[0], _plain_value(entry, head, limits)
            if value is _NOT_PLAIN:
                value = any_value(_full_kv(entry, limits).value, limits)
                cache_key = None  # the cache is for plain encodings only (see _full_kv)
            elif head[1] == TAG_DOUBLE and value - value != 0.0:
                value = json.dumps(value)  # inf or nan: the string any_value gives them
        else:
            key, value = entry
        if len(attrs) < max_attributes:
            attrs[key] = value
        else:
            dropped += 1
            limits.truncated += 1
    truncated = limits.truncated - truncated_before
    limits.truncated = truncated_before
    result = (dumps(attrs) if attrs else EMPTY_OBJECT, dropped, truncated)
    if cache_key is not None:
        if len(_JSON_CACHE) >= _JSON_CACHE_MAX_ENTRIES:
            _JSON_CACHE.clear()
        _JSON_CACHE[cache_key] = result
    return result


def _span_row(span: Any, limits: Limits) -> tuple:
    """One validated span as a tuple in ``_OWN`` + ``_PROMOTED_ORDER`` column order.

    A tuple per span, transposed per scope, is the cheapest typed columnar build in Python.
    """
    raw_trace, raw_span, raw_parent = span.trace_id, span.span_id, span.parent_span_id
    # Fast path for well-formed ids; hex_id explains what is wrong otherwise.
    if len(raw_trace) == 16 and raw_trace != _ZERO16 and len(raw_span) == 8 \
            and raw_span != _ZERO8 and (not raw_parent or (
                len(raw_parent) == 8 and raw_parent != _ZERO8)):
        trace_id, span_id, parent = raw_trace.hex(), raw_span.hex(), raw_parent.hex()
    else:
        trace_id = hex_id(raw_trace, 16, c.TRACE_ID)
        span_id = hex_id(raw_span, 8, c.SPAN_ID)
        parent = hex_id(raw_parent, 8, c.PARENT_SPAN_ID, optional=True)
    start, end = span.start_time_unix_nano, span.end_time_unix_nano
    if not (limits.earliest_ns <= start <= end <= limits.latest_ns and start > 0):
        limits.check_time(start, "start_time_unix_nano")
        limits.check_time(end, "end_time_unix_nano")
        raise Reject(f"end_time_unix_nano {end} is before start_time_unix_nano {start}")
    promoted = list(_NO_PROMOTED)
    # Attributes bound for the JSON, in order: encoded bytes (plain, never-promoted keys,
    # decoded in _attributes_json) or (key, value) pairs decoded here.
    rest: list[Any] = []
    only_bytes = True
    headers = _HEADERS
    short_text = limits.short_text
    for kvb in span.attributes:  # encoded KeyValues (see collector.lite_spans)
        head = headers.get(kvb[:kvb[1] + 5]) if len(kvb) > 4 else None
        if head is None:
            head = _header(kvb)
        if head is not None and len(kvb) == head[3]:
            key, tag, offset, total, slot, target, as_float = head
            if slot is None:
                rest.append(kvb)
                continue
            if target is not None:  # inline paths for the values vLLM sends
                if tag == TAG_DOUBLE:
                    value = _double(kvb, offset)[0]
                    if value - value == 0.0:  # finite (inf - inf and nan - nan are nan)
                        promoted[target] = value
                        continue
                elif tag == TAG_INT:
                    first = kvb[offset]
                    if first < 0x80 and total - offset == 1:
                        promoted[target] = float(first) if as_float else first
                        continue
                    second = kvb[offset + 1] if total - offset == 2 else 0x80
                    if first >= 0x80 and second < 0x80:  # two-byte varint
                        number = (first & 0x7F) | second << 7
                        promoted[target] = float(number) if as_float else number
                        continue
                elif kvb[offset] == total - offset - 1:  # string with a one-byte length
                    value = kvb[offset + 1:].decode("utf-8")
                    promoted[target] = value if len(value) <= short_text else limits.text(value)
                    continue
            value = _plain_value(kvb, head, limits)
            if value is not _NOT_PLAIN:
                if tag == TAG_DOUBLE and value - value != 0.0:
                    value = json.dumps(value)  # inf or nan: the string any_value gives them
                elif target is not None:  # this kind always fits the column
                    promoted[target] = float(value) if as_float else value
                    continue
                # The general rule ("NaN" does fit a string column).
                if isinstance(value, slot[1]) and value is not True and value is not False:
                    promoted[slot[0]] = float(value) if slot[2] else value
                else:
                    rest.append((key, value))
                    only_bytes = False
                continue
        # Any other encoding: exactly what the real schema reads, with the general rule.
        kv = _full_kv(kvb, limits)
        key, value, slot = limits.key(kv.key), any_value(kv.value, limits), \
            _PROMOTED_SLOT.get(kv.key)
        if slot and isinstance(value, slot[1]) and value is not True and value is not False:
            promoted[slot[0]] = float(value) if slot[2] else value
        else:
            rest.append((key, value))
            only_bytes = False
    attributes_json, dropped, truncated = _attributes_json(rest, only_bytes, limits) \
        if rest else _NO_ATTRIBUTES
    dropped += span.dropped_attributes_count
    limits.truncated += truncated
    status = span.status
    name, message = span.name, status.message
    if len(name) > limits.short_text:
        name = limits.text(name)
    if len(message) > limits.short_text:
        message = limits.text(message)
    trace_state = span.trace_state
    if len(trace_state) > limits.short_name:
        trace_state = limits.name(trace_state)
    return (
        trace_id, span_id, parent, trace_state, span.flags, name,
        span.kind, start, end, status.code, message, attributes_json,
        events_json(span, limits) if span.events else _EMPTY_LIST,
        links_json(span, limits) if span.links else _EMPTY_LIST,
        dropped, span.dropped_events_count, span.dropped_links_count, *promoted,
    )


class _LiteScope:
    """One ScopeSpans of the lite view, decoded span by span by :func:`_span_row`."""

    def __init__(self, spans: Any) -> None:
        self.spans, self.count = spans, len(spans)

    def skip(self, limits: Limits) -> None:
        """Rejected whole: nothing to do (the lite view's check covered its fields)."""

    def columns(self, limits: Limits, out: Outcome, index: int) -> list[Any] | None:
        """The accepted spans' columns (None if none); rejections go to ``out``."""
        rows = []
        for span in self.spans:
            try:
                rows.append(_span_row(span, limits))
            except ITEM_ERRORS as error:
                out.reject(f"span {index}", error)
            index += 1
        return list(zip(*rows, strict=True)) if rows else None


def _lite_scopes(raw: bytes, limits: Limits) -> Iterator[tuple[Any, str, Any, str, Any]]:
    """The request's scopes through the lite view (the Python path)."""
    # The same request with span attributes as bytes (collector.lite_spans): the real parse
    # validated it, this view only reads it faster.
    lite = LiteRequest.FromString(raw)
    # Unknown fields anywhere but in span attributes (bytes in this view, see _full_kv):
    # dropping them changes the view's size. A few times cheaper than walking the real tree.
    lite.DiscardUnknownFields()
    if lite.ByteSize() != len(raw):
        limits.unknown_fields = True
    for resource_spans in lite.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            yield (resource_spans.resource, resource_spans.schema_url, scope_spans.scope,
                   scope_spans.schema_url, _LiteScope(scope_spans.spans))


def decode_spans(request: Any, limits: Limits, names: NameLimiter | RequestNames,
                 received_ns: int,
                 payload: bytes | None = None) -> Outcome:
    """Decode an ``ExportTraceServiceRequest`` into ``spans`` columns.

    Args:
        request: the parsed (hence validated) request.
        limits: validation limits (``now_ns`` is the receive time).
        names: the service/host cardinality cap, and the model names' (``admit_model``).
        received_ns: the value of ``received_ns`` for every row.
        payload: the protobuf bytes ``request`` was parsed from, when the caller has them
            (saves re-encoding it).

    Returns:
        The accepted rows as columns (exactly ``SPAN_COLUMNS``), with the number of rejected
        spans and the first reasons.
    """
    out = Outcome(columns={name: [] for name in SPAN_COLUMNS})
    cols = out.columns
    index = 0
    raw = request.SerializeToString() if payload is None else payload
    # The compiled kernel where built (collector/span_kernel.py), else the Python path.
    scopes = span_kernel.scopes(raw, limits)
    for resource_msg, resource_url, scope, scope_url, spans in \
            _lite_scopes(raw, limits) if scopes is None else scopes:
        try:
            resource = decode_resource(resource_msg, limits, names)
            scope_attrs, _ = attribute_map(scope.attributes, limits)
            scope_json = bounded_json(scope_attrs, limits) if scope_attrs else EMPTY_OBJECT
        except ITEM_ERRORS as error:  # a bad resource or scope rejects all of its spans
            spans.skip(limits)
            for _ in range(spans.count):
                out.reject(f"span {index}", error)
                index += 1
            continue
        columns = spans.columns(limits, out, index)
        index += spans.count
        if columns is None:
            continue
        count = len(columns[0])
        for name, values in zip(_ROW_COLUMNS, columns, strict=True):
            span_kernel.extend(cols, name, values)
        models = cols[c.GEN_AI_REQUEST_MODEL]
        # A scope's spans mostly name one model: a name admitted as itself is in the
        # budget's seen set, so it is asked once per scope (an overflow still per span).
        admitted: dict[str, str] = {}
        for i in range(len(models) - count, len(models)):
            model = models[i]
            if model is not None:
                kept = admitted.get(model)
                if kept is None:
                    kept = names.admit_model(model)
                    if kept == model:
                        admitted[model] = kept
                models[i] = kept
        shared = {
            c.SERVICE_NAME: resource.service_name, c.HOST_NAME: resource.host_name,
            c.RESOURCE_ATTRIBUTES: resource.json,
            c.RESOURCE_SCHEMA_URL: limits.name(resource_url),
            c.SCOPE_NAME: limits.name(scope.name), c.SCOPE_VERSION: limits.name(scope.version),
            c.SCOPE_ATTRIBUTES: scope_json,
            c.SCOPE_SCHEMA_URL: limits.name(scope_url),
            c.RECEIVED_NS: received_ns,
        }
        for name, value in shared.items():
            cols[name].extend([value] * count)
        out.rows += count
        out.shared_chars += count * shared_chars(shared)
    out.truncated = limits.truncated
    out.unknown_fields = limits.unknown_fields
    return out


#: The promoted keys as the kernel reads them: (UTF-8 key, 0 str / 1 float / 2 int).
span_kernel.configure(
    tuple((key.encode(), 0 if types == (str,) else 1 if types is _FLOAT_TYPES else 2)
          for key, (_, types) in _PROMOTED.items()),
    EMPTY_OBJECT, _EMPTY_LIST, _span_row, _attributes_json,
    (_ROW_COLUMNS.index(c.GEN_AI_REQUEST_MODEL),))  # names.admit_model may replace values
