"""ExportLogsServiceRequest -> columns of the raw ``log_records`` table.

``ts_ns`` is the record's time, else its observed time; ``observed_ns`` is the observed time,
else the receive time (the OTLP spec lets the collector fill it in). A string ``body`` is
stored as is; any other body is stored as its JSON value.
"""

from __future__ import annotations

from typing import Any

from fleetlens.collector.decode_common import (
    ITEM_ERRORS,
    Limits,
    Outcome,
    any_value,
    attribute_map,
    decode_resource,
    dumps,
    hex_id,
    shared_chars,
)
from fleetlens.collector.name_budget import NameLimiter, RequestNames
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

LOG_COLUMNS: tuple[str, ...] = tuple(t.table(t.LOG_RECORDS).dtypes)


def _log_row(record: Any, limits: Limits, received_ns: int) -> dict[str, Any]:
    observed = record.observed_time_unix_nano or received_ns
    ts = record.time_unix_nano or observed
    limits.check_time(ts, "time_unix_nano")
    if observed != ts:  # both are stored: both must be real times (2^64-1 is not)
        limits.check_time(observed, "observed_time_unix_nano")
    body = any_value(record.body, limits) if record.HasField("body") else None
    attrs, dropped = attribute_map(record.attributes, limits)
    return {
        c.TS_NS: ts, c.OBSERVED_NS: observed, c.SEVERITY_NUMBER: record.severity_number,
        c.SEVERITY_TEXT: limits.name(record.severity_text),
        c.BODY: body if isinstance(body, str) or body is None else dumps(body),
        c.EVENT_NAME: limits.name(record.event_name),
        c.TRACE_ID: hex_id(record.trace_id, 16, c.TRACE_ID, optional=True),
        c.SPAN_ID: hex_id(record.span_id, 8, c.SPAN_ID, optional=True),
        c.FLAGS: record.flags, c.ATTRIBUTES: dumps(attrs),
        c.DROPPED_ATTRIBUTES_COUNT: record.dropped_attributes_count + dropped,
    }


def decode_logs(request: Any, limits: Limits, names: NameLimiter | RequestNames,
                received_ns: int) -> Outcome:
    """Decode an ``ExportLogsServiceRequest`` into ``log_records`` columns, record by record."""
    out = Outcome(columns={name: [] for name in LOG_COLUMNS})
    index = 0
    for resource_logs in request.resource_logs:
        for scope_logs in resource_logs.scope_logs:
            scope = scope_logs.scope
            try:
                resource = decode_resource(resource_logs.resource, limits, names)
            except ITEM_ERRORS as error:
                for _ in scope_logs.log_records:
                    out.reject(f"log record {index}", error)
                    index += 1
                continue
            shared = {
                c.SERVICE_NAME: resource.service_name, c.HOST_NAME: resource.host_name,
                c.RESOURCE_ATTRIBUTES: resource.json, c.SCOPE_NAME: limits.name(scope.name),
                c.SCOPE_VERSION: limits.name(scope.version), c.RECEIVED_NS: received_ns,
            }
            per_row = shared_chars(shared)
            for record in scope_logs.log_records:
                try:
                    row = _log_row(record, limits, received_ns)
                except ITEM_ERRORS as error:
                    out.reject(f"log record {index}", error)
                    index += 1
                    continue
                index += 1
                out.add(row, shared, per_row)
    out.truncated = limits.truncated
    return out
