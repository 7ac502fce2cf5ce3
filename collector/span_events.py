"""A span's events and links as the JSON text of the ``events`` and ``links`` columns.

Split from ``decode_spans.py`` (the Python span decoder); both the Python path and the spans
the C kernel hands back use them (the kernel itself takes no span with events or links).
"""

from __future__ import annotations

from typing import Any

from fleetlens.collector.decode_common import (
    Limits,
    attribute_map,
    check_count,
    dumps,
    hex_id,
)
from fleetlens.pipeline.schema import columns as c


def events_json(span: Any, limits: Limits) -> str:
    """The span's events as JSON (attributes capped, times checked to fit int64)."""
    out = []
    for event in span.events:
        attrs, dropped = attribute_map(event.attributes, limits)
        out.append({
            c.TS_NS: check_count(event.time_unix_nano, "event time_unix_nano"),
            c.NAME: limits.text(event.name),
            c.ATTRIBUTES: attrs,
            c.DROPPED_ATTRIBUTES_COUNT: event.dropped_attributes_count + dropped,
        })
    return dumps(out)


def links_json(span: Any, limits: Limits) -> str:
    """The span's links as JSON (ids validated as the span's own)."""
    out = []
    for link in span.links:
        attrs, dropped = attribute_map(link.attributes, limits)
        out.append({
            c.TRACE_ID: hex_id(link.trace_id, 16, "link trace_id"),
            c.SPAN_ID: hex_id(link.span_id, 8, "link span_id"),
            c.TRACE_STATE: limits.name(link.trace_state), c.ATTRIBUTES: attrs,
            c.DROPPED_ATTRIBUTES_COUNT: link.dropped_attributes_count + dropped,
            c.FLAGS: link.flags,
        })
    return dumps(out)
