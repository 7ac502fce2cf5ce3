"""ExportMetricsServiceRequest -> columns of the raw ``metric_points`` table.

One row per data point. ``kind`` is ``gauge``, ``sum``, ``histogram``,
``exponential_histogram`` or ``summary``; ``temporality`` is ``delta``, ``cumulative`` or
``unspecified``; ``value`` holds the number of gauge and sum points (null for the others, which
keep ``count``/``sum``/``min``/``max`` and their buckets or ``quantiles`` JSON).
"""

from __future__ import annotations

from typing import Any

from fleetlens.collector.decode_common import (
    ITEM_ERRORS,
    Limits,
    Outcome,
    Reject,
    attribute_map,
    check_count,
    decode_resource,
    dumps,
    finite,
    shared_chars,
)
from fleetlens.collector.name_budget import NameLimiter, RequestNames
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

POINT_COLUMNS: tuple[str, ...] = tuple(t.table(t.METRIC_POINTS).dtypes)
KINDS = ("gauge", "sum", "histogram", "exponential_histogram", "summary")
TEMPORALITY = {0: "unspecified", 1: "delta", 2: "cumulative"}


def _optional(point: Any, name: str) -> float | None:
    return getattr(point, name) if point.HasField(name) else None


def _point_row(kind: str, data: Any, point: Any, limits: Limits) -> dict[str, Any]:
    ts, start = point.time_unix_nano, point.start_time_unix_nano
    limits.check_time(ts, "time_unix_nano")
    # No skew check on the start: a cumulative counter's start is its process start,
    # which may be weeks ago.
    if start:
        if start > ts:
            raise Reject(f"start_time_unix_nano {start} is after time_unix_nano {ts}")
    attrs, _ = attribute_map(point.attributes, limits)
    row: dict[str, Any] = {
        c.TS_NS: ts, c.START_NS: start, c.FLAGS: point.flags, c.ATTRIBUTES: dumps(attrs),
    }
    if kind in ("sum", "histogram", "exponential_histogram"):
        row[c.TEMPORALITY] = TEMPORALITY.get(data.aggregation_temporality, "unspecified")
    if kind == "sum":
        row[c.IS_MONOTONIC] = data.is_monotonic
    if kind in ("gauge", "sum"):
        which = point.WhichOneof("value")
        row[c.VALUE] = float(getattr(point, which)) if which else None
        return row
    row[c.COUNT] = check_count(point.count, "count")
    if kind == "summary":
        row[c.SUM] = point.sum
        # Prometheus exposes NaN quantiles for an empty summary: kept, in the JSON
        # convention for non-finite doubles (JSON itself has no NaN).
        row[c.QUANTILES] = dumps([{"quantile": finite(q.quantile), "value": finite(q.value)}
                                  for q in point.quantile_values])
        return row
    row.update({c.SUM: _optional(point, "sum"), c.MIN: _optional(point, "min"),
                c.MAX: _optional(point, "max")})
    if kind == "histogram":
        counts, bounds = list(point.bucket_counts), list(point.explicit_bounds)
        if counts and len(counts) != len(bounds) + 1:
            raise Reject(f"{len(counts)} bucket_counts for {len(bounds)} explicit_bounds")
        if counts:
            check_count(max(counts), "bucket count")
        row[c.BUCKET_COUNTS], row[c.EXPLICIT_BOUNDS] = counts, bounds
        return row
    positive, negative = list(point.positive.bucket_counts), list(point.negative.bucket_counts)
    check_count(max(positive, default=0), "positive bucket count")
    check_count(max(negative, default=0), "negative bucket count")
    row.update({
        c.EXP_SCALE: point.scale, c.EXP_ZERO_COUNT: check_count(point.zero_count, "zero_count"),
        c.EXP_POSITIVE_OFFSET: point.positive.offset,
        c.EXP_POSITIVE_BUCKET_COUNTS: positive,
        c.EXP_NEGATIVE_OFFSET: point.negative.offset,
        c.EXP_NEGATIVE_BUCKET_COUNTS: negative,
    })
    return row


def decode_metrics(request: Any, limits: Limits, names: NameLimiter | RequestNames,
                   received_ns: int) -> Outcome:
    """Decode an ``ExportMetricsServiceRequest`` into ``metric_points`` columns.

    Each data point is validated on its own (timestamps within the skew, start <= time,
    histogram bucket counts matching the bounds); invalid points are rejected and counted
    for ``rejected_data_points``.
    """
    out = Outcome(columns={name: [] for name in POINT_COLUMNS})
    index = 0
    for resource_metrics in request.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            scope = scope_metrics.scope
            for metric in scope_metrics.metrics:
                kind = metric.WhichOneof("data")
                points = getattr(metric, kind).data_points if kind else ()
                try:
                    if not metric.name:
                        raise Reject("metric name is empty")
                    resource = decode_resource(resource_metrics.resource, limits, names)
                    shared = {
                        c.METRIC_NAME: limits.text(metric.name), c.METRIC_KIND: kind,
                        c.UNIT: limits.name(metric.unit),
                        c.DESCRIPTION: limits.text(metric.description),
                        c.SERVICE_NAME: resource.service_name, c.HOST_NAME: resource.host_name,
                        c.RESOURCE_ATTRIBUTES: resource.json, c.SCOPE_NAME: limits.name(scope.name),
                        c.SCOPE_VERSION: limits.name(scope.version), c.RECEIVED_NS: received_ns,
                    }
                    per_row = shared_chars(shared)
                except ITEM_ERRORS as error:
                    for _ in points:
                        out.reject(f"data point {index}", error)
                        index += 1
                    continue
                for point in points:
                    try:
                        row = _point_row(kind, getattr(metric, kind), point, limits)
                    except ITEM_ERRORS as error:
                        out.reject(f"data point {index} of {metric.name!r}", error)
                        index += 1
                        continue
                    index += 1
                    out.add(row, shared, per_row)
    out.truncated = limits.truncated
    return out
