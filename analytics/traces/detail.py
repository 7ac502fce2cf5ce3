"""One trace in full (issue 35 item 3): every span with its attributes, resource attributes,
events and links, times to the millisecond; its requests with their phases and energy; and
the signals of each request's instance during its lifetime (:mod:`.signals`).

Input: ``spans`` (one copy per ``(trace_id, span_id)``, as :func:`otlp_export.unique_spans`
keeps), ``requests``, ``request_energy``, ``engine_samples``, ``gpu_samples`` and
``instance_gpus``. Output: a :class:`TraceDetail` of plain frames; the trace explorer and
``fleetlens traces show`` render it. Offsets are milliseconds since the trace's first span
started, so spans, events and samples share one time axis.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import polars as pl

from fleetlens.analytics.traces.lookup import trace_spans
from fleetlens.analytics.traces.otlp_export import unique_spans
from fleetlens.analytics.traces.signals import request_signals, trace_requests
from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

if TYPE_CHECKING:
    import duckdb

NS = 1_000_000_000
#: The tables a detail reads (a connection's views).
TABLES = (t.SPANS, t.REQUESTS, t.REQUEST_ENERGY, t.ENGINE_SAMPLES, t.GPU_SAMPLES,
          t.INSTANCE_GPUS)
#: Offsets and durations in ms, rounded to the microsecond (times to the millisecond).
MS_DIGITS = 3
#: The spans frame's columns, in the order shown.
SPAN_COLUMNS = (c.TRACE_ID, c.SPAN_ID, c.PARENT_SPAN_ID, c.NAME, "offset_ms", "duration_ms",
                c.START_NS, c.END_NS, c.SERVICE_NAME, c.HOST_NAME, c.KIND, c.STATUS_CODE,
                c.STATUS_MESSAGE, c.SCOPE_NAME)
_ATTRS = {"span": pl.String, "source": pl.String, "key": pl.String, "value": pl.String}
_EVENTS = {"span": pl.String, c.TS_NS: pl.Int64, "offset_ms": pl.Float64, c.NAME: pl.String,
           c.ATTRIBUTES: pl.String}
_LINKS = {"span": pl.String, "linked_trace_id": pl.String, "linked_span_id": pl.String,
          c.ATTRIBUTES: pl.String}


@dataclass(frozen=True)
class TraceDetail:
    """Everything stored about one trace, shaped for reading.

    Attributes:
        trace_id: the trace.
        start_ns: when its first span started (offset 0 of every ``offset_ms``).
        spans: one row per span (:data:`SPAN_COLUMNS`), in start order.
        attributes: ``span, source (span|resource|scope), key, value`` (value as text: a
            string as is, anything else as JSON), promoted gen_ai.* columns included.
        events: ``span, ts_ns, offset_ms, name, attributes`` (a JSON map).
        links: ``span, linked_trace_id, linked_span_id, attributes``.
        requests: the trace's requests with phases, tokens and energy (:mod:`.signals`).
        signals: ``request_id, ts_ns, offset_ms, signal, series, value``: its instance's
            engine and GPU samples during each request's lifetime.
    """

    trace_id: str
    start_ns: int
    spans: pl.DataFrame
    attributes: pl.DataFrame
    events: pl.DataFrame
    links: pl.DataFrame
    requests: pl.DataFrame
    signals: pl.DataFrame


def ms_since(ns: pl.Expr, start_ns: int) -> pl.Expr:
    """Milliseconds from ``start_ns`` to ``ns``, to the microsecond."""
    return ((ns - start_ns) / 1e6).round(MS_DIGITS)


def text(value: Any) -> str:  # noqa: ANN401 - any decoded attribute value
    """An attribute value as shown: strings as they are, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def span_label(row: dict[str, Any]) -> str:
    """``name (span id)``: which span a row of the other frames belongs to."""
    return f"{row[c.NAME]} ({row[c.SPAN_ID]})"


def _map(raw: str | None) -> dict[str, Any]:
    return json.loads(raw) if raw else {}


def _attribute_rows(row: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    label = span_label(row)
    out = []
    # the collector moved these gen_ai.* keys to typed columns: they are the span's too
    for key, (column, _) in a.PROMOTED_SPAN_ATTRIBUTE_DTYPES.items():
        if row.get(column) is not None:
            out.append((label, "span", key, text(row[column])))
    for source, column in (("span", c.ATTRIBUTES), ("resource", c.RESOURCE_ATTRIBUTES),
                           ("scope", c.SCOPE_ATTRIBUTES)):
        out += [(label, source, k, text(v)) for k, v in _map(row.get(column)).items()]
    return out


def shape_spans(spans: pl.DataFrame) -> tuple[int, pl.DataFrame, pl.DataFrame, pl.DataFrame,
                                              pl.DataFrame]:
    """The stored ``spans`` rows of one trace as (start_ns, spans, attributes, events,
    links) frames (see :class:`TraceDetail`)."""
    spans = unique_spans(spans)
    start = int(spans[c.START_NS].min())
    attrs, events, links = [], [], []
    for row in spans.iter_rows(named=True):
        attrs += _attribute_rows(row)
        label = span_label(row)
        for e in json.loads(row.get(c.EVENTS) or "[]"):
            events.append((label, e[c.TS_NS], round((e[c.TS_NS] - start) / 1e6, MS_DIGITS),
                           e.get(c.NAME) or "", json.dumps(e.get(c.ATTRIBUTES) or {})))
        for k in json.loads(row.get(c.LINKS) or "[]"):
            links.append((label, k[c.TRACE_ID], k[c.SPAN_ID],
                          json.dumps(k.get(c.ATTRIBUTES) or {})))
    shown = spans.with_columns(
        ms_since(pl.col(c.START_NS), start).alias("offset_ms"),
        ((pl.col(c.END_NS) - pl.col(c.START_NS)) / 1e6).round(MS_DIGITS).alias("duration_ms"),
    ).select([n for n in SPAN_COLUMNS if n in spans.columns or n.endswith("_ms")])
    return (start, shown, pl.DataFrame(attrs, schema=_ATTRS, orient="row"),
            pl.DataFrame(events, schema=_EVENTS, orient="row").sort(c.TS_NS),
            pl.DataFrame(links, schema=_LINKS, orient="row"))


def trace_detail(con: duckdb.DuckDBPyConnection, ident: str,
                 around_ns: int | None = None) -> TraceDetail:
    """Trace ``ident`` (a trace id or a request id) in full.

    Args:
        con: a connection with ``spans``, ``requests``, ``request_energy``,
            ``engine_samples``, ``gpu_samples`` (and ``instance_gpus`` where there is one).
        ident: the trace or request id.
        around_ns: a time the trace overlaps, if known (scans an hour either side).

    Raises:
        SearchError: no such trace or request.
    """
    raw = trace_spans(con, ident, around_ns)
    trace_id = str(raw[c.TRACE_ID][0])
    start, spans, attrs, events, links = shape_spans(raw)
    requests = trace_requests(con, trace_id, start)
    return TraceDetail(trace_id, start, spans, attrs, events, links,
                       requests.with_columns(ms_since(pl.col(c.ARRIVAL_NS), start)
                                             .alias("offset_ms")),
                       request_signals(con, requests, start))
