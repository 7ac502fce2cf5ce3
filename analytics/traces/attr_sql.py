"""Span attribute filters (``--attr``) as SQL over ``spans``.

A request matches when one span of its trace has every condition (Tempo's ``{ a && b }``),
and one of the ``--span-name`` names when given.
A key is read where the collector put it: a promoted gen_ai.* key from its typed column
(or from the JSON when its value had the wrong type), any other key from the span's
attribute JSON, else its resource's. The matching trace ids are computed once per search
into a temporary table of the search's own cursor (the count and the page both use them).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from fleetlens.analytics.traces.query import AttrFilter, TraceQuery
from fleetlens.analytics.traces.sql import Params, describe, quote
from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

if TYPE_CHECKING:
    import duckdb

NS = 1_000_000_000
#: How far before (after) the time range a span of a matching trace may start: a trace's
#: gateway span starts before the engine's arrival, and its spans may end after the range.
SPAN_SLACK_NS = 3600 * NS
#: The temporary table of matching trace ids (one per cursor, so searches never share it).
MATCHES = "fleetlens_trace_matches"


def json_pointer(key: str) -> str:
    """A JSON pointer (RFC 6901) to a top-level key: dots in OTel keys are no separators."""
    return "/" + key.replace("~", "~0").replace("/", "~1")


def _text(attr: AttrFilter, spans: dict[str, str], bind: Params) -> tuple[str, str | None]:
    """SQL of the attribute's value as text on a span row (alias ``s``, NULL when absent),
    and a cheap necessary condition to test first (``None``: none)."""
    pointer = bind(json_pointer(attr.key))
    attrs, resource = f"s.{quote(c.ATTRIBUTES)}", f"s.{quote(c.RESOURCE_ATTRIBUTES)}"
    span_json = f"json_extract_string(NULLIF({attrs}, ''), {pointer})"
    promoted = a.PROMOTED_SPAN_ATTRIBUTE_DTYPES.get(attr.key)
    if promoted and promoted[0] in spans:
        # a promoted key whose value had the wrong type stayed in the JSON
        return f"COALESCE(CAST(s.{quote(promoted[0])} AS VARCHAR), {span_json})", None
    # The key's JSON text must appear in one of the maps: a substring test is ~5x cheaper
    # than parsing the JSON, so most spans are dismissed before json_extract runs.
    # The collector writes UTF-8 as is; other writers may escape non-ASCII characters as
    # backslash-u and four hex digits: both forms.
    forms = dict.fromkeys(json.dumps(attr.key, ensure_ascii=ascii) for ascii in (False, True))
    prefilter = "(" + " OR ".join(f"contains({column}, {bind(form)})" for form in forms
                                  for column in (attrs, resource)) + ")"
    resource_json = f"json_extract_string(NULLIF({resource}, ''), {pointer})"
    return f"COALESCE({span_json}, {resource_json})", prefilter


def _only_a_string(value: str) -> bool:
    """Whether only a JSON string can read as ``value`` (``true``, ``null``, ``[1]`` also
    match a stored boolean, null or array, whose JSON text has no quotes)."""
    return value not in ("true", "false", "null") and not value.startswith(("[", "{"))


def _contains_json(value: str, bind: Params) -> str:
    """SQL: the span's or its resource's attribute JSON holds ``value`` as a JSON string
    (either escaping of non-ASCII characters; see :func:`_text`)."""
    forms = dict.fromkeys(json.dumps(value, ensure_ascii=ascii) for ascii in (False, True))
    return "(" + " OR ".join(f"contains(s.{quote(column)}, {bind(form)})" for form in forms
                             for column in (c.ATTRIBUTES, c.RESOURCE_ATTRIBUTES)) + ")"


def condition(attr: AttrFilter, spans: dict[str, str], bind: Params) -> str:
    """One attribute condition on a span row (alias ``s``)."""
    text, prefilter = _text(attr, spans, bind)
    number = f"TRY_CAST({text} AS DOUBLE)"
    if attr.op == "exists":
        test = f"{text} IS NOT NULL"
    elif attr.op in ("=", "!="):
        equal = f"{text} = {bind(attr.value)}"
        if attr.number is not None:  # =1 matches a stored 1.0
            equal = f"({equal} OR {number} = {bind(attr.number)})"
        elif attr.op == "=" and prefilter is not None and _only_a_string(attr.value):
            # a string value's JSON text is in the map too: most spans of a common key are
            # dismissed by a substring test before the JSON is parsed
            prefilter = f"({prefilter} AND {_contains_json(attr.value, bind)})"
        test = equal if attr.op == "=" else f"({text} IS NOT NULL AND NOT {equal})"
    else:
        test = f"{number} {attr.op} {bind(attr.number)}"
    return test if prefilter is None else f"({prefilter} AND {test})"


def match_traces(cursor: duckdb.DuckDBPyConnection, query: TraceQuery) -> str:
    """Store the ids of the traces with a span matching every ``query.attrs`` condition
    (and named one of ``query.span_names``, if any) in a temporary table of ``cursor``;
    returns the condition on a ``requests`` row (alias ``r``) that its trace is one of
    them."""
    bind = Params()
    spans = describe(cursor, t.SPANS)
    conditions = [condition(attr, spans, bind) for attr in query.attrs]
    if query.span_names:
        conditions.append(f"list_contains({bind(list(query.span_names))}::VARCHAR[], "
                          f"s.{quote(c.NAME)})")
    start = f"s.{quote(c.START_NS)}"
    # The time range bounds the spans scanned too: hour partitions and row-group statistics
    # turn it into a few files instead of every raw segment.
    if query.start_ns is not None:
        conditions.append(f"{start} >= {bind(query.start_ns - SPAN_SLACK_NS)}")
    if query.end_ns is not None:
        conditions.append(f"{start} < {bind(query.end_ns + SPAN_SLACK_NS)}")
    trace = quote(c.TRACE_ID)
    # No DISTINCT: the IN below is a semi-join, which a trace id listed twice does not
    # change, and deduplicating 3M ids cost half a second of a whole-day search.
    cursor.execute(f"CREATE TEMP TABLE {MATCHES} AS SELECT s.{trace} FROM "
                   f"{quote(t.SPANS)} s WHERE {' AND '.join(conditions)}", bind.values)
    return f"r.{trace} IN (SELECT {trace} FROM {MATCHES})"
