"""Trace search: the ``requests`` rows a :class:`~analytics.traces.query.TraceQuery`
selects, sorted and paged, each with its phase split (queue, prefill, decode, overhead).

Input: ``requests`` (dimension filters, ranges), ``spans`` (attribute filters: a request
matches when one span of its trace has every attribute condition, as Tempo's
``{ a && b }``), ``instance_gpus`` (``--gpu``: the request's instance ran on the GPU).
Output: one page of ``requests`` rows, with every column the table has, and the match count.

Read through :func:`pipeline.storage.connect` (local or s3://, the same views the dashboard
and ``fleetlens sql`` use). Every user value reaches DuckDB as a bound parameter; column names
come from the schema or from the columns DuckDB reports for the table, never from the user's
text unchecked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleetlens.analytics.traces.query import AttrFilter, SearchError, TraceQuery
from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

if TYPE_CHECKING:
    import duckdb
    import polars as pl

    from fleetlens.pipeline.storage import DataDir

NS = 1_000_000_000
#: How far before (after) the time range a span of a matching trace may start: a trace's
#: gateway span starts before the engine's arrival, and its spans may end after the range.
SPAN_SLACK_NS = 3600 * NS
#: Hive partition folders (``date=``, ``hour=``) that DuckDB's views show as columns.
PARTITION_COLUMNS = frozenset({c.DATE, c.HOUR})
#: DuckDB types a ``--min``/``--max`` or numeric sort may use.
_NUMERIC = ("DOUBLE", "FLOAT", "BIGINT", "INTEGER", "SMALLINT", "TINYINT", "HUGEINT",
            "UBIGINT", "UINTEGER", "USMALLINT", "UTINYINT", "DECIMAL", "REAL")


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


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def describe(con: duckdb.DuckDBPyConnection, table: str) -> dict[str, str]:
    """Column name -> DuckDB type of a table or view (contract columns plus extras; not the
    folder names of its hive partitions, which are no data of a row)."""
    return {row[0]: row[1] for row in
            con.execute(f"DESCRIBE {_quote(t.table(table).name)}").fetchall()
            if row[0] not in PARTITION_COLUMNS}


def _is_numeric(duck_type: str) -> bool:
    return duck_type.upper().startswith(_NUMERIC)


class _Params:
    """Bound parameters of one query, named in order (``$p0``, ``$p1``, ...)."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def __call__(self, value: Any) -> str:
        name = f"p{len(self.values)}"
        self.values[name] = value
        return f"${name}"


#: (query field, column, flag) of the filters that keep rows whose column is one of values.
_DIMENSIONS = (
    ("services", c.SERVICE_NAME, "--service"), ("models", c.MODEL, "--model"),
    ("hosts", c.HOST_NAME, "--host"), ("instances", c.INSTANCE_ID, "--instance"),
    ("regions", c.REGION, "--region"), ("gpu_models", c.GPU_MODEL, "--gpu-model"),
    ("finish_reasons", c.FINISH_REASON, "--finish-reason"),
)


def where(con: duckdb.DuckDBPyConnection, query: TraceQuery, columns: dict[str, str],
          bind: _Params) -> str:
    """The ``WHERE`` condition (alias ``r`` for ``requests``) of ``query``.

    Raises:
        SearchError: a filter on a column the data does not have, or not numeric.
    """
    parts = ["TRUE"]
    arrival = f"r.{_quote(c.ARRIVAL_NS)}"
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
        parts.append(f"list_contains({bind(list(values))}::VARCHAR[], r.{_quote(column)})")
    if query.error is not None:
        parts.append(f"r.{_quote(c.IS_ERROR)} = {bind(query.error)}")
    for bound in query.bounds:
        if bound.column not in columns or not _is_numeric(columns[bound.column]):
            raise SearchError(f"--min/--max {bound.column}: not a numeric column of requests "
                              f"(one of: {', '.join(numeric_columns(columns))})")
        for value, op in ((bound.low, ">="), (bound.high, "<=")):
            if value is not None:
                parts.append(f"r.{_quote(bound.column)} {op} {bind(value)}")
    if query.gpus:
        parts.append(_gpu_condition(query.gpus, bind))
    if query.attrs:
        parts.append(_attr_condition(con, query, bind))
    return " AND ".join(parts)


def numeric_columns(columns: dict[str, str]) -> list[str]:
    """The numeric columns of ``requests`` (for ``--min``/``--max`` and their help)."""
    return [name for name, kind in columns.items() if _is_numeric(kind)]


def _gpu_condition(gpus: tuple[str, ...], bind: _Params) -> str:
    # instance_gpus maps an engine instance to the GPUs it was seen on (the agent's gauge).
    g, r = "g.", "r."
    return (f"EXISTS (SELECT 1 FROM {_quote(t.INSTANCE_GPUS)} g WHERE "
            f"{g}{_quote(c.HOST_NAME)} = {r}{_quote(c.HOST_NAME)} AND "
            f"{g}{_quote(c.INSTANCE_ID)} = {r}{_quote(c.INSTANCE_ID)} AND "
            f"list_contains({bind(list(gpus))}::VARCHAR[], {g}{_quote(c.GPU_UUID)}))")


def _json_pointer(key: str) -> str:
    """A JSON pointer (RFC 6901) to a top-level key: dots in OTel keys are no separators."""
    return "/" + key.replace("~", "~0").replace("/", "~1")


def _attr_text(attr: AttrFilter, spans: dict[str, str], bind: _Params) -> str:
    """SQL of the attribute's value as text on a span row (alias ``s``), NULL when absent:
    a promoted key (gen_ai.*) is read from its typed column, where the collector put it;
    other keys from the span's attributes, else its resource's."""
    pointer = bind(_json_pointer(attr.key))
    span_json = f"json_extract_string(NULLIF(s.{_quote(c.ATTRIBUTES)}, ''), {pointer})"
    resource_json = (f"json_extract_string(NULLIF(s.{_quote(c.RESOURCE_ATTRIBUTES)}, ''), "
                     f"{pointer})")
    promoted = a.PROMOTED_SPAN_ATTRIBUTE_DTYPES.get(attr.key)
    if promoted and promoted[0] in spans:
        # a promoted key whose value had the wrong type stayed in the JSON
        return f"COALESCE(CAST(s.{_quote(promoted[0])} AS VARCHAR), {span_json})"
    return f"COALESCE({span_json}, {resource_json})"


def _one_attr(attr: AttrFilter, spans: dict[str, str], bind: _Params) -> str:
    text = _attr_text(attr, spans, bind)
    if attr.op == "exists":
        return f"{text} IS NOT NULL"
    number = f"TRY_CAST({text} AS DOUBLE)"
    if attr.op in ("=", "!="):
        equal = f"{text} = {bind(attr.value)}"
        if attr.number is not None:
            equal = f"({equal} OR {number} = {bind(attr.number)})"
        return equal if attr.op == "=" else f"({text} IS NOT NULL AND NOT {equal})"
    return f"{number} {attr.op} {bind(attr.number)}"


def _attr_condition(con: duckdb.DuckDBPyConnection, query: TraceQuery, bind: _Params) -> str:
    spans = describe(con, t.SPANS)
    conditions = [_one_attr(attr, spans, bind) for attr in query.attrs]
    start = f"s.{_quote(c.START_NS)}"
    # The time range bounds the spans scanned too: hour partitions and row-group statistics
    # turn it into a few files instead of every raw segment.
    if query.start_ns is not None:
        conditions.append(f"{start} >= {bind(query.start_ns - SPAN_SLACK_NS)}")
    if query.end_ns is not None:
        conditions.append(f"{start} < {bind(query.end_ns + SPAN_SLACK_NS)}")
    return (f"r.{_quote(c.TRACE_ID)} IN (SELECT s.{_quote(c.TRACE_ID)} FROM "
            f"{_quote(t.SPANS)} s WHERE {' AND '.join(conditions)})")


def order_by(query: TraceQuery, columns: dict[str, str]) -> str:
    """``ORDER BY`` terms: the sort column, then trace and span id (stable pages)."""
    if query.sort not in columns:
        raise SearchError(f"--sort {query.sort}: not a column of requests (one of: "
                          f"{', '.join(columns)})")
    direction = "DESC" if query.descending else "ASC"
    return (f"r.{_quote(query.sort)} {direction} NULLS LAST, r.{_quote(c.TRACE_ID)}, "
            f"r.{_quote(c.SPAN_ID)}")


def search(con: duckdb.DuckDBPyConnection, query: TraceQuery) -> SearchResult:
    """One page of the requests ``query`` selects, and how many it selects in all.

    Args:
        con: from :func:`pipeline.storage.connect` with ``requests`` (and ``spans`` for
            attribute filters, ``instance_gpus`` for GPU filters).
        query: the filters, sort and page.

    Raises:
        SearchError: a filter the data cannot answer (unknown or non-numeric column).
    """
    columns = describe(con, t.REQUESTS)
    bind = _Params()
    condition = where(con, query, columns, bind)
    order = order_by(query, columns)
    table = _quote(t.REQUESTS)
    shown = ", ".join(f"r.{_quote(name)}" for name in columns)
    cursor = con.cursor()
    try:
        total = cursor.execute(f"SELECT count(*) FROM {table} r WHERE {condition}",
                               bind.values).fetchall()[0][0]
        page = dict(bind.values)
        page["limit"], page["offset"] = query.limit, query.offset
        rows = cursor.sql(f"SELECT {shown} FROM {table} r WHERE {condition} ORDER BY {order} "
                          "LIMIT $limit OFFSET $offset", params=page).pl()
    finally:
        cursor.close()
    return SearchResult(rows, int(total), query)


def tables_for(query: TraceQuery) -> tuple[str, ...]:
    """The tables a query reads (a view over the raw spans reads every segment's footer, so
    it is made only when an attribute filter needs it)."""
    return (t.REQUESTS, *((t.SPANS,) if query.attrs else ()),
            *((t.INSTANCE_GPUS,) if query.gpus else ()))


def search_data_dir(root: DataDir, query: TraceQuery) -> SearchResult:
    """:func:`search` over the tables of a data directory (local or s3://)."""
    from fleetlens.pipeline.storage import connect

    con = connect(root, tables=tables_for(query))
    try:
        return search(con, query)
    finally:
        con.close()
