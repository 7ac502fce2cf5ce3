"""One trace's stored spans, found by its trace id or by the id of one of its requests.

Input: ``requests`` (request id -> trace id; a request not in it yet: the spans'
``gen_ai.request.id``) and ``spans``. Output: the trace's ``spans``
rows, every column, as stored (duplicates included: :func:`otlp_export.unique_spans` keeps
one of each). Ids have no index, so a lookup scans the id column; a known time (a request's
arrival) narrows the scan to an hour either side.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from fleetlens.analytics.traces.query import SearchError
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

if TYPE_CHECKING:
    import duckdb
    import polars as pl

NS = 1_000_000_000
#: How far from the request's arrival the spans of its trace are looked for.
AROUND_NS = 3600 * NS
_TRACE_ID = re.compile(r"^[0-9a-f]{32}$")


def is_trace_id(text: str) -> bool:
    """Whether ``text`` is a trace id as stored (32 lowercase hex digits, case ignored)."""
    return bool(_TRACE_ID.match(text.strip().lower()))


def _request_trace(con: duckdb.DuckDBPyConnection, request_id: str) -> tuple[str, int] | None:
    cursor = con.cursor()  # the dashboard's connection is shared between sessions
    try:
        row = cursor.execute(
            f'SELECT "{c.TRACE_ID}", "{c.ARRIVAL_NS}" FROM "{t.REQUESTS}" '
            f'WHERE "{c.REQUEST_ID}" = $id LIMIT 1', {"id": request_id}).fetchall()
    finally:
        cursor.close()
    if row:
        return row[0][0], int(row[0][1])
    return _span_request_trace(con, request_id)


def _span_request_trace(con: duckdb.DuckDBPyConnection,
                        request_id: str) -> tuple[str, int] | None:
    """The trace of a request id from the spans' promoted ``gen_ai.request.id`` column: a
    request whose spans arrived but that the pipeline has not turned into a row yet."""
    from fleetlens.analytics.traces.sql import describe

    cursor = con.cursor()
    try:
        if c.GEN_AI_REQUEST_ID not in describe(cursor, t.SPANS):
            return None
        row = cursor.execute(
            f'SELECT "{c.TRACE_ID}", "{c.START_NS}" FROM "{t.SPANS}" '
            f'WHERE "{c.GEN_AI_REQUEST_ID}" = $id LIMIT 1', {"id": request_id}).fetchall()
    finally:
        cursor.close()
    return (row[0][0], int(row[0][1])) if row else None


def trace_spans(con: duckdb.DuckDBPyConnection, ident: str,
                around_ns: int | None = None) -> pl.DataFrame:
    """The spans of trace ``ident`` (a trace id, or a request id of ``requests``).

    Args:
        con: a connection with ``spans`` (and ``requests`` for request ids).
        ident: the trace id or request id.
        around_ns: a time the trace overlaps, if known (a link's request arrival): the scan
            is limited to an hour either side.

    Raises:
        SearchError: no trace or request with that id.
    """
    ident = ident.strip()
    around = around_ns
    if is_trace_id(ident):
        trace_id = ident.lower()
    else:
        found = _request_trace(con, ident)
        if found is None:
            raise SearchError(f"{ident!r} is neither a trace id (32 hex digits) nor the id of "
                              "a request in this data directory")
        trace_id, around = found
    params: dict[str, object] = {"id": trace_id}
    window = "TRUE"
    if around is not None:
        window = f'"{c.START_NS}" BETWEEN $lo AND $hi'
        params.update(lo=around - AROUND_NS, hi=around + AROUND_NS)
    cursor = con.cursor()
    try:
        spans = cursor.sql(f'SELECT * FROM "{t.SPANS}" WHERE {window} AND '
                           f'"{c.TRACE_ID}" = $id', params=params).pl()
    finally:
        cursor.close()
    if spans.is_empty():
        raise SearchError(f"no spans of trace {trace_id} in this data directory")
    return spans

