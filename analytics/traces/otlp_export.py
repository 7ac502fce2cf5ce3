"""One trace's stored spans as OTLP/JSON (an ``ExportTraceServiceRequest``), for Jaeger,
Tempo or any OTLP/HTTP receiver.

Input: the ``spans`` rows of one trace (raw, possibly delivered twice: one copy per
``(trace_id, span_id)`` is kept, the first received). Output: the OTLP JSON encoding
(protobuf JSON mapping with the OTLP exceptions): ``resourceSpans`` > ``scopeSpans`` >
``spans``, hex trace and span ids, attributes as ``AnyValue``, times and 64-bit integers as
decimal strings, enums as numbers.

The collector's decoding is undone: promoted gen_ai.* columns become attributes again, the
JSON attribute maps become ``AnyValue`` lists (``{"bytes_b64": ...}`` back to ``bytesValue``)
and events and links get their OTLP names. Fed back to a fleetlens collector, the spans are
stored as they were (tests/analytics/test_traces_export.py). What the collector never kept
cannot come back: attributes it cut, and whether a promoted float was sent as an int.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

if TYPE_CHECKING:
    import duckdb
    import polars as pl

#: Span columns that hold one resource's or one scope's identity (spans are grouped by them).
RESOURCE_KEY = (c.RESOURCE_ATTRIBUTES, c.RESOURCE_SCHEMA_URL)
SCOPE_KEY = (c.SCOPE_NAME, c.SCOPE_VERSION, c.SCOPE_ATTRIBUTES, c.SCOPE_SCHEMA_URL)


def any_value(value: Any) -> dict[str, Any]:
    """A stored (JSON) attribute value as an OTLP/JSON ``AnyValue``."""
    if value is None:
        return {}
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}  # int64: a decimal string in the JSON mapping
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, list):
        return {"arrayValue": {"values": [any_value(v) for v in value]}}
    if isinstance(value, dict):
        if list(value) == [a.ANY_VALUE_BYTES_KEY]:
            return {"bytesValue": value[a.ANY_VALUE_BYTES_KEY]}  # base64 in both encodings
        return {"kvlistValue": {"values": key_values(value)}}
    raise TypeError(f"no AnyValue for {type(value).__name__}")


def key_values(attrs: dict[str, Any]) -> list[dict[str, Any]]:
    """An attribute map as an OTLP/JSON ``KeyValue`` list."""
    return [{"key": key, "value": any_value(value)} for key, value in attrs.items()]


def _map(text: str | None) -> dict[str, Any]:
    return json.loads(text) if text else {}


def _promoted(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The gen_ai.* attributes the collector moved to typed columns, as attributes again."""
    out = []
    for key, (column, dtype) in a.PROMOTED_SPAN_ATTRIBUTE_DTYPES.items():
        value = row.get(column)
        if value is None:
            continue
        typed = (float(value) if dtype == t.F64 else int(value) if dtype == t.I64
                 else str(value))
        out.append({"key": key, "value": any_value(typed)})
    return out


def _nonzero(out: dict[str, Any], name: str, value: Any) -> None:
    # proto3 leaves zero and empty fields out of the JSON; receivers read them as zero
    if value:
        out[name] = value


def _event(event: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"timeUnixNano": str(event[c.TS_NS]), "name": event[c.NAME],
                           "attributes": key_values(event.get(c.ATTRIBUTES) or {})}
    _nonzero(out, "droppedAttributesCount", event.get(c.DROPPED_ATTRIBUTES_COUNT))
    return out


def _link(link: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"traceId": link[c.TRACE_ID], "spanId": link[c.SPAN_ID],
                           "attributes": key_values(link.get(c.ATTRIBUTES) or {})}
    _nonzero(out, "traceState", link.get(c.TRACE_STATE))
    _nonzero(out, "droppedAttributesCount", link.get(c.DROPPED_ATTRIBUTES_COUNT))
    _nonzero(out, "flags", link.get(c.FLAGS))
    return out


def otlp_span(row: dict[str, Any]) -> dict[str, Any]:
    """One ``spans`` row as an OTLP/JSON ``Span``."""
    span: dict[str, Any] = {
        "traceId": row[c.TRACE_ID], "spanId": row[c.SPAN_ID], "name": row[c.NAME] or "",
        "kind": row[c.KIND] or 0,
        "startTimeUnixNano": str(row[c.START_NS]), "endTimeUnixNano": str(row[c.END_NS]),
        "attributes": _promoted(row) + key_values(_map(row[c.ATTRIBUTES])),
    }
    _nonzero(span, "parentSpanId", row.get(c.PARENT_SPAN_ID))
    _nonzero(span, "traceState", row.get(c.TRACE_STATE))
    _nonzero(span, "flags", row.get(c.FLAGS))
    _nonzero(span, "droppedAttributesCount", row.get(c.DROPPED_ATTRIBUTES_COUNT))
    _nonzero(span, "droppedEventsCount", row.get(c.DROPPED_EVENTS_COUNT))
    _nonzero(span, "droppedLinksCount", row.get(c.DROPPED_LINKS_COUNT))
    events = [_event(e) for e in json.loads(row.get(c.EVENTS) or "[]")]
    links = [_link(k) for k in json.loads(row.get(c.LINKS) or "[]")]
    _nonzero(span, "events", events)
    _nonzero(span, "links", links)
    status: dict[str, Any] = {}
    _nonzero(status, "code", row.get(c.STATUS_CODE))
    _nonzero(status, "message", row.get(c.STATUS_MESSAGE))
    span["status"] = status
    return span


def unique_spans(spans: pl.DataFrame) -> pl.DataFrame:
    """One row per ``(trace_id, span_id)``, the first received, in start order."""
    import polars as pl

    if spans.is_empty():
        return spans
    order = [col for col in (c.RECEIVED_NS, c.START_NS) if col in spans.columns]
    return (spans.sort(order, nulls_last=True)
            .unique([c.TRACE_ID, c.SPAN_ID], keep="first", maintain_order=True)
            .sort(c.START_NS, pl.col(c.SPAN_ID)))


def to_otlp(spans: pl.DataFrame) -> dict[str, Any]:
    """Spans (``spans`` rows) as an OTLP/JSON ``ExportTraceServiceRequest`` object: one
    ``resourceSpans`` per resource, one ``scopeSpans`` per scope within it."""
    resources: dict[tuple, dict[tuple, list[dict[str, Any]]]] = {}
    for row in unique_spans(spans).iter_rows(named=True):
        resource = tuple(row.get(k) for k in RESOURCE_KEY)
        scope = tuple(row.get(k) for k in SCOPE_KEY)
        resources.setdefault(resource, {}).setdefault(scope, []).append(otlp_span(row))
    out = []
    for (resource_attrs, resource_url), scopes in resources.items():
        scope_spans = []
        for (name, version, scope_attrs, scope_url), rows in scopes.items():
            scope: dict[str, Any] = {}
            _nonzero(scope, "name", name)
            _nonzero(scope, "version", version)
            _nonzero(scope, "attributes", key_values(_map(scope_attrs)))
            entry: dict[str, Any] = {"scope": scope, "spans": rows}
            _nonzero(entry, "schemaUrl", scope_url)
            scope_spans.append(entry)
        item: dict[str, Any] = {"resource": {"attributes": key_values(_map(resource_attrs))},
                                "scopeSpans": scope_spans}
        _nonzero(item, "schemaUrl", resource_url)
        out.append(item)
    return {"resourceSpans": out}


def otlp_json(con: duckdb.DuckDBPyConnection, ident: str, around_ns: int | None = None) -> str:
    """Trace ``ident`` (a trace id or a request id) as OTLP/JSON text (the dashboard's
    download and ``fleetlens traces export``); ``around_ns`` as in
    :func:`analytics.traces.lookup.trace_spans`.

    Raises:
        SearchError: no such trace or request.
    """
    from fleetlens.analytics.traces.lookup import trace_spans

    spans = trace_spans(con, ident, around_ns)
    return json.dumps(to_otlp(spans), indent=1, ensure_ascii=False) + "\n"
