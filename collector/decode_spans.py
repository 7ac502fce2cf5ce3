"""ExportTraceServiceRequest -> columns of the raw ``spans`` table, span by span validated.

Typed columnar conversion: one pass over the protobuf objects appends to one Python list per
column (no ``MessageToDict``). Promoted gen_ai.* attributes go to their typed columns and stay
out of the ``attributes`` JSON; a promoted key whose value has the wrong type stays in the JSON
and leaves its column null.
"""

from __future__ import annotations

from typing import Any

from collector.decode_common import (
    Limits,
    NameLimiter,
    Outcome,
    Reject,
    any_value,
    attribute_map,
    decode_resource,
    dumps,
    hex_id,
)
from pipeline.schema import attributes as a
from pipeline.schema import columns as c
from pipeline.schema import tables as t

SPAN_COLUMNS: tuple[str, ...] = tuple(t.table(t.SPANS).columns)
_FLOAT_TYPES = (float, int)
#: promoted key -> (column, accepted Python types of the decoded value)
_PROMOTED: dict[str, tuple[str, tuple[type, ...]]] = {
    key: (col, (str,) if dtype == t.STR else _FLOAT_TYPES if dtype == t.F64 else (int,))
    for key, (col, dtype) in a.PROMOTED_SPAN_ATTRIBUTES.items()
}


def _events(span: Any, limits: Limits) -> str:
    out = []
    for event in span.events:
        attrs, dropped = attribute_map(event.attributes, limits)
        out.append({
            c.TS_NS: event.time_unix_nano, c.NAME: limits.text(event.name),
            c.ATTRIBUTES: attrs,
            c.DROPPED_ATTRIBUTES_COUNT: event.dropped_attributes_count + dropped,
        })
    return dumps(out)


def _links(span: Any, limits: Limits) -> str:
    out = []
    for link in span.links:
        attrs, dropped = attribute_map(link.attributes, limits)
        out.append({
            c.TRACE_ID: hex_id(link.trace_id, 16, "link trace_id"),
            c.SPAN_ID: hex_id(link.span_id, 8, "link span_id"),
            c.TRACE_STATE: link.trace_state, c.ATTRIBUTES: attrs,
            c.DROPPED_ATTRIBUTES_COUNT: link.dropped_attributes_count + dropped,
            c.FLAGS: link.flags,
        })
    return dumps(out)


def _span_row(span: Any, limits: Limits) -> dict[str, Any]:
    """One validated span as column -> value (without resource/scope columns)."""
    row: dict[str, Any] = {
        c.TRACE_ID: hex_id(span.trace_id, 16, c.TRACE_ID),
        c.SPAN_ID: hex_id(span.span_id, 8, c.SPAN_ID),
        c.PARENT_SPAN_ID: hex_id(span.parent_span_id, 8, c.PARENT_SPAN_ID, optional=True),
    }
    start, end = span.start_time_unix_nano, span.end_time_unix_nano
    limits.check_time(start, "start_time_unix_nano")
    limits.check_time(end, "end_time_unix_nano")
    if end < start:
        raise Reject(f"end_time_unix_nano {end} is before start_time_unix_nano {start}")
    attrs: dict[str, Any] = {}
    dropped = span.dropped_attributes_count
    for kv in span.attributes:
        key = kv.key
        value = any_value(kv.value, limits)
        promoted = _PROMOTED.get(key)
        if promoted and isinstance(value, promoted[1]) and not isinstance(value, bool):
            row[promoted[0]] = float(value) if promoted[1] is _FLOAT_TYPES else value
        elif len(attrs) < limits.max_attributes:
            attrs[key] = value
        else:
            dropped += 1
            limits.truncated += 1
    status = span.status
    row.update({
        c.TRACE_STATE: span.trace_state, c.FLAGS: span.flags, c.NAME: limits.text(span.name),
        c.KIND: span.kind, c.START_NS: start, c.END_NS: end, c.STATUS_CODE: status.code,
        c.STATUS_MESSAGE: limits.text(status.message), c.ATTRIBUTES: dumps(attrs),
        c.EVENTS: _events(span, limits), c.LINKS: _links(span, limits),
        c.DROPPED_ATTRIBUTES_COUNT: dropped,
        c.DROPPED_EVENTS_COUNT: span.dropped_events_count,
        c.DROPPED_LINKS_COUNT: span.dropped_links_count,
    })
    return row


def decode_spans(request: Any, limits: Limits, names: NameLimiter, received_ns: int) -> Outcome:
    """Decode an ``ExportTraceServiceRequest`` into ``spans`` columns.

    Args:
        request: the parsed request.
        limits: validation limits (``now_ns`` is the receive time).
        names: the service/host cardinality cap.
        received_ns: the value of ``received_ns`` for every row.

    Returns:
        The accepted rows as columns (exactly ``SPAN_COLUMNS``), with the number of rejected
        spans and the first reasons.
    """
    out = Outcome(columns={name: [] for name in SPAN_COLUMNS})
    cols = out.columns
    index = 0
    for resource_spans in request.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            scope = scope_spans.scope
            try:
                resource = decode_resource(resource_spans.resource, limits, names)
                scope_attrs, _ = attribute_map(scope.attributes, limits)
            except Reject as error:  # a bad resource or scope rejects all of its spans
                for _ in scope_spans.spans:
                    out.reject(f"span {index}", error)
                    index += 1
                continue
            shared = {
                c.SERVICE_NAME: resource.service_name, c.HOST_NAME: resource.host_name,
                c.RESOURCE_ATTRIBUTES: resource.json,
                c.RESOURCE_SCHEMA_URL: resource_spans.schema_url,
                c.SCOPE_NAME: scope.name, c.SCOPE_VERSION: scope.version,
                c.SCOPE_ATTRIBUTES: dumps(scope_attrs), c.SCOPE_SCHEMA_URL: scope_spans.schema_url,
                c.RECEIVED_NS: received_ns,
            }
            for span in scope_spans.spans:
                try:
                    row = _span_row(span, limits)
                except Reject as error:
                    out.reject(f"span {index}", error)
                    index += 1
                    continue
                index += 1
                row.update(shared)
                for name, column in cols.items():
                    column.append(row.get(name))
                out.rows += 1
    out.truncated = limits.truncated
    return out
