"""Trace search: the ``requests`` rows a :class:`~analytics.traces.query.TraceQuery`
selects, sorted and paged, each with its phase split (queue, prefill, decode, overhead).

Input: ``requests`` (dimension filters, ranges), ``spans`` (attribute filters, see
:mod:`analytics.traces.attr_sql`), ``instance_gpus`` (``--gpu``: the request's instance ran
on the GPU). Output: one page of ``requests`` rows, every column the table has, and the
match count. Order: the sort column, then arrival, trace id and span id, so pages neither
skip nor repeat a row.

Read through :func:`pipeline.storage.connect` (local or s3://, the same views the dashboard
and ``fleetlens sql`` use). Every user value reaches DuckDB as a bound parameter; column names
come from the schema or from the columns DuckDB reports for the table, never from the user's
text unchecked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fleetlens.analytics.traces.attr_sql import MATCHES, match_traces
from fleetlens.analytics.traces.query import SearchError, TraceQuery
from fleetlens.analytics.traces.sql import Params, describe, quote
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

if TYPE_CHECKING:
    import duckdb
    import polars as pl

    from fleetlens.pipeline.storage import DataDir

#: DuckDB types a ``--min``/``--max`` may use.
_NUMERIC = ("DOUBLE", "FLOAT", "BIGINT", "INTEGER", "SMALLINT", "TINYINT", "HUGEINT",
            "UBIGINT", "UINTEGER", "USMALLINT", "UTINYINT", "DECIMAL", "REAL")
#: (query field, column, flag) of the filters that keep rows whose column is one of values.
_DIMENSIONS = (
    ("services", c.SERVICE_NAME, "--service"), ("models", c.MODEL, "--model"),
    ("hosts", c.HOST_NAME, "--host"), ("instances", c.INSTANCE_ID, "--instance"),
    ("regions", c.REGION, "--region"), ("gpu_models", c.GPU_MODEL, "--gpu-model"),
    ("finish_reasons", c.FINISH_REASON, "--finish-reason"),
)
_KEY = "fleetlens_sort_key"
#: The temporary table of an attribute search's selected requests (one per cursor).
SELECTED = "fleetlens_selected_requests"


@dataclass(frozen=True)
class SearchResult:
    """One page of matches: ``rows`` (``requests`` columns) and how many match in all."""

    rows: pl.DataFrame
    total: int
    query: TraceQuery

    @property
    def next_offset(self) -> int | None:
        """The ``offset`` of the next page, ``None`` on the last one."""
        end = self.query.offset + self.rows.height
        return end if end < self.total else None


def numeric_columns(columns: dict[str, str]) -> list[str]:
    """The numeric columns of ``requests`` (for ``--min``/``--max`` and their help)."""
    return [name for name, kind in columns.items() if kind.upper().startswith(_NUMERIC)]


def where(query: TraceQuery, columns: dict[str, str], bind: Params) -> str:
    """The ``WHERE`` condition (alias ``r`` for ``requests``) of every filter of ``query``
    but the attributes.

    Raises:
        SearchError: a filter on a column the data does not have, or not numeric.
    """
    parts = ["TRUE"]
    arrival = f"r.{quote(c.ARRIVAL_NS)}"
    if query.start_ns is not None:
        parts.append(f"{arrival} >= {bind(query.start_ns)}")
    if query.end_ns is not None:
        parts.append(f"{arrival} < {bind(query.end_ns)}")
    for field, column, flag in _DIMENSIONS:
        values = getattr(query, field)
        if not values:
            continue
        if column not in columns:
            raise SearchError(f"{flag}: the requests in this data directory have no {column} "
                              "column (add it to [pipeline] dimensions)")
        parts.append(f"list_contains({bind(list(values))}::VARCHAR[], r.{quote(column)})")
    if query.error is not None:
        parts.append(f"r.{quote(c.IS_ERROR)} = {bind(query.error)}")
    numeric = numeric_columns(columns)
    for bound in query.bounds:
        if bound.column not in numeric:
            raise SearchError(f"--min/--max {bound.column}: not a numeric column of requests "
                              f"(one of: {', '.join(numeric)})")
        for value, op in ((bound.low, ">="), (bound.high, "<=")):
            if value is not None:
                parts.append(f"r.{quote(bound.column)} {op} {bind(value)}")
    if query.gpus:
        # instance_gpus maps an engine instance to the GPUs it was seen on (the agent's gauge)
        parts.append(
            f"EXISTS (SELECT 1 FROM {quote(t.INSTANCE_GPUS)} g WHERE "
            f"g.{quote(c.HOST_NAME)} = r.{quote(c.HOST_NAME)} AND "
            f"g.{quote(c.INSTANCE_ID)} = r.{quote(c.INSTANCE_ID)} AND "
            f"list_contains({bind(list(query.gpus))}::VARCHAR[], g.{quote(c.GPU_UUID)}))")
    return " AND ".join(parts)


def _page(cursor: duckdb.DuckDBPyConnection, query: TraceQuery, columns: dict[str, str],
          condition: str, bind: Params, selected: bool = False) -> pl.DataFrame:
    """The page's rows in two steps: first the (sort value, arrival) of the page's rows,
    reading only those columns (a top-N over every column of 10M rows decoded them all),
    then the rows with those arrivals, which row-group statistics find in a few groups.

    ``selected``: the keys come from :data:`SELECTED` (:func:`_selected`, an attribute
    search) and ``condition`` is the search's without the attributes; a fetched row counts
    when its trace is among :data:`attr_sql.MATCHES`, asked of the ~50 fetched trace ids
    (the whole semi-join again would cost as much as the selection did).
    """
    import polars as pl

    way = "DESC" if query.descending else "ASC"
    sort, arrival = f"r.{quote(query.sort)}", f"r.{quote(c.ARRIVAL_NS)}"
    table = quote(t.REQUESTS)
    picked = (f"SELECT r.{_KEY}, {arrival} FROM {SELECTED} r" if selected else
              f"SELECT {sort} AS {_KEY}, {arrival} FROM {table} r WHERE {condition}")
    keys = cursor.sql(
        f"{picked} ORDER BY {_KEY} {way} NULLS LAST, {arrival} {way} "
        "LIMIT $limit OFFSET $offset",
        params=dict({} if selected else bind.values, limit=query.limit, offset=query.offset)
    ).pl().with_row_index("_rank")
    if keys.is_empty():
        return pl.DataFrame(schema=cursor.sql(f"SELECT * FROM {table} LIMIT 0").pl()
                            .select(list(columns)).schema)
    times = keys[c.ARRIVAL_NS]
    params = dict(bind.values, times=times.to_list(), lo=times.min(), hi=times.max())
    rows = cursor.sql(
        f"SELECT {', '.join(f'r.{quote(name)}' for name in columns)} FROM {table} r "
        f"WHERE {condition} AND {arrival} BETWEEN $lo AND $hi AND "
        f"{arrival} IN (SELECT unnest($times::BIGINT[]))", params=params).pl()
    if selected:
        trace = quote(c.TRACE_ID)
        matched = cursor.sql(f"SELECT DISTINCT {trace} FROM {MATCHES} WHERE {trace} IN "
                             "(SELECT unnest($ids::VARCHAR[]))",
                             params={"ids": rows[c.TRACE_ID].unique().to_list()}).pl()
        rows = rows.filter(pl.col(c.TRACE_ID).is_in(matched[c.TRACE_ID].implode()))
    # Rows sharing a page key's arrival (to the nanosecond) are told apart by their ids.
    return (rows.with_columns(pl.col(query.sort).alias(_KEY))
            .join(keys, on=[_KEY, c.ARRIVAL_NS], how="inner", nulls_equal=True)
            .sort(["_rank", c.TRACE_ID, c.SPAN_ID])
            .unique([c.TRACE_ID, c.SPAN_ID], keep="first", maintain_order=True)
            .head(keys.height).select(list(columns)))


def _selected(cursor: duckdb.DuckDBPyConnection, query: TraceQuery, condition: str,
              bind: Params) -> int:
    """Store the sort value and arrival of every request ``condition`` selects in the
    temporary table :data:`SELECTED` of ``cursor``; returns how many.

    An attribute filter is a semi-join of every request on the matching traces (a second of
    10M requests against 3M traces): run once, it serves both the count and the page.
    """
    cursor.execute(f"CREATE TEMP TABLE {SELECTED} AS SELECT r.{quote(query.sort)} AS {_KEY}, "
                   f"r.{quote(c.ARRIVAL_NS)} FROM {quote(t.REQUESTS)} r WHERE {condition}",
                   bind.values)
    return int(cursor.execute(f"SELECT count(*) FROM {SELECTED}").fetchall()[0][0])


def search(con: duckdb.DuckDBPyConnection, query: TraceQuery) -> SearchResult:
    """One page of the requests ``query`` selects, and how many it selects in all.

    Args:
        con: from :func:`pipeline.storage.connect` with ``requests`` (and ``spans`` for
            attribute filters, ``instance_gpus`` for GPU filters).
        query: the filters, sort and page.

    Raises:
        SearchError: a filter the data cannot answer (unknown or non-numeric column).
    """
    # A cursor of its own: the attribute matches live in a temporary table of this cursor,
    # so searches sharing the dashboard's connection never see each other's.
    cursor = con.cursor()
    try:
        columns = describe(cursor, t.REQUESTS)
        bind = Params()
        condition = where(query, columns, bind)
        if query.sort not in columns:
            raise SearchError(f"--sort {query.sort}: not a column of requests (one of: "
                              f"{', '.join(columns)})")
        if query.attrs or query.span_names:
            matched = f"{condition} AND {match_traces(cursor, query)}"
            total = _selected(cursor, query, matched, bind)
            rows = _page(cursor, query, columns, condition, bind, selected=True)
        else:
            total = cursor.execute(f"SELECT count(*) FROM {quote(t.REQUESTS)} r WHERE "
                                   f"{condition}", bind.values).fetchall()[0][0]
            rows = _page(cursor, query, columns, condition, bind)
    finally:
        cursor.close()
    return SearchResult(rows, int(total), query)


def tables_for(query: TraceQuery) -> tuple[str, ...]:
    """The tables a query reads (a view over the raw spans reads every segment's footer, so
    it is made only when an attribute filter needs it)."""
    return (t.REQUESTS, *((t.SPANS,) if query.attrs or query.span_names else ()),
            *((t.INSTANCE_GPUS,) if query.gpus else ()))


def search_data_dir(root: DataDir, query: TraceQuery) -> SearchResult:
    """:func:`search` over the tables of a data directory (local or s3://)."""
    from fleetlens.pipeline.storage import connect

    con = connect(root, tables=tables_for(query))
    try:
        return search(con, query)
    finally:
        con.close()
