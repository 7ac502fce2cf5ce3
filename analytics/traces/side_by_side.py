"""Two requests side by side (issue 35 item 4), or a request against the median request of
its service and model around its arrival: phases, tokens, cached tokens, and the engine's
queue depth, batch and KV usage when it arrived.

Input: ``requests`` and ``engine_samples`` (the instance's last sample at or before the
arrival, at most :data:`SAMPLE_AGE_NS` old). Output: one row per field with both values and
their difference (:func:`side_by_side`). Ids are request ids or trace ids; every value
reaches DuckDB as a bound parameter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import polars as pl

from fleetlens.analytics.traces.lookup import is_trace_id
from fleetlens.analytics.traces.query import SearchError
from fleetlens.analytics.traces.sql import quote
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

if TYPE_CHECKING:
    import duckdb

NS = 1_000_000_000
#: The request fields compared, in the order shown.
REQUEST_FIELDS = (c.E2E_S, c.QUEUE_S, c.PREFILL_S, c.DECODE_S, c.OVERHEAD_S, c.TTFT_S,
                  c.TPOT_S, c.INPUT_TOKENS, c.OUTPUT_TOKENS, c.CACHED_TOKENS)
#: The engine's state when the request arrived.
ENGINE_FIELDS = (c.NUM_WAITING, c.NUM_RUNNING, c.KV_CACHE_USAGE)
#: An engine sample older than this at the arrival says nothing about it.
SAMPLE_AGE_NS = 60 * NS
#: The median's window around the request's arrival (half on each side).
WINDOW_NS = 300 * NS


def _select(condition: str) -> str:
    """The requests matching ``condition`` (alias ``r``) with the engine state at arrival:
    an as-of join on the instance's samples, an old sample's values left null."""
    fresh = f"r.{quote(c.ARRIVAL_NS)} - e.{quote(c.TS_NS)} <= {SAMPLE_AGE_NS}"
    engine = ", ".join(f"CASE WHEN {fresh} THEN e.{quote(n)} END AS {quote(n)}"
                       for n in ENGINE_FIELDS)
    fields = ", ".join(f"r.{quote(n)}" for n in (
        c.REQUEST_ID, c.TRACE_ID, c.SERVICE_NAME, c.MODEL, c.HOST_NAME, c.INSTANCE_ID,
        c.ARRIVAL_NS, *REQUEST_FIELDS))
    on = " AND ".join(f"e.{quote(k)} = r.{quote(k)}" for k in (c.HOST_NAME, c.INSTANCE_ID))
    return (f"SELECT {fields}, {engine} FROM {quote(t.REQUESTS)} r ASOF LEFT JOIN "
            f"{quote(t.ENGINE_SAMPLES)} e ON {on} AND r.{quote(c.ARRIVAL_NS)} >= "
            f"e.{quote(c.TS_NS)} WHERE {condition}")


def request_row(con: duckdb.DuckDBPyConnection, ident: str) -> dict[str, Any]:
    """The request ``ident`` (request id, or the trace id of its first request) with the
    engine's state at its arrival.

    Raises:
        SearchError: no such request.
    """
    ident = ident.strip()
    column = c.TRACE_ID if is_trace_id(ident) else c.REQUEST_ID
    cursor = con.cursor()
    try:
        rows = cursor.sql(_select(f"r.{quote(column)} = $id") + f" ORDER BY r."
                          f"{quote(c.ARRIVAL_NS)} LIMIT 1",
                          params={"id": ident.lower() if column == c.TRACE_ID else ident}).pl()
    finally:
        cursor.close()
    if rows.is_empty():
        raise SearchError(f"{ident!r}: no request or trace with that id in this data "
                          "directory")
    return rows.row(0, named=True)


def median_row(con: duckdb.DuckDBPyConnection, of: dict[str, Any],
               window_ns: int = WINDOW_NS) -> dict[str, Any]:
    """The median of every field over the requests of ``of``'s service and model arriving
    in ``[arrival - window_ns / 2, arrival + window_ns / 2)`` (``of`` itself included), with
    their count as
    ``requests``."""
    cursor = con.cursor()
    try:
        frame = cursor.sql(_select(
            f"r.{quote(c.SERVICE_NAME)} = $service AND r.{quote(c.MODEL)} = $model AND "
            f"r.{quote(c.ARRIVAL_NS)} >= $lo AND r.{quote(c.ARRIVAL_NS)} < $hi"), params={
                "service": of[c.SERVICE_NAME], "model": of[c.MODEL],
                "lo": of[c.ARRIVAL_NS] - window_ns // 2,
                "hi": of[c.ARRIVAL_NS] + window_ns // 2}).pl()
    finally:
        cursor.close()
    out: dict[str, Any] = {name: frame[name].cast(pl.Float64).median()
                           for name in (*REQUEST_FIELDS, *ENGINE_FIELDS)}
    return {**out, "requests": frame.height, c.SERVICE_NAME: of[c.SERVICE_NAME],
            c.MODEL: of[c.MODEL]}


def side_by_side(a: dict[str, Any], b: dict[str, Any]) -> pl.DataFrame:
    """One row per field: ``field``, ``a``, ``b``, ``difference`` (a - b) and ``ratio``
    (a / b; null where b is 0 or a value is missing)."""
    rows = []
    for name in (*REQUEST_FIELDS, *ENGINE_FIELDS):
        x, y = a.get(name), b.get(name)
        x = None if x is None else float(x)
        y = None if y is None else float(y)
        rows.append({"field": name, "a": x, "b": y,
                     "difference": None if None in (x, y) else x - y,  # type: ignore[operator]
                     "ratio": x / y if x is not None and y else None})
    return pl.DataFrame(rows, schema={"field": pl.String, "a": pl.Float64, "b": pl.Float64,
                                      "difference": pl.Float64, "ratio": pl.Float64})
