""""What is different about these": a selection of a search's requests (a time span and a
latency band of one latency column, drawn on :mod:`analytics.traces.heatmap`'s grid)
compared with the rest of the search's requests, by the dimension comparison attribution
uses for incidents (:func:`analytics.attribution.dimensions.compare_dimensions`: lift and
share of excess per host, GPU, instance, model, region, prompt-length bucket, ...).

Beyond the score (:mod:`analytics.traces.compare_rank`): values the same band holds as much
outside the selection's span are ranked after those the span has more of, values selecting
the same requests are one difference, and an instance names the GPUs it holds (a request
names no GPU of an instance on several).

Input: a :class:`~analytics.traces.query.TraceQuery` (its filters; sort and page ignored)
over ``requests`` (``spans`` for attribute filters, ``instance_gpus`` for GPUs) and a
:class:`Selection`. Output: a :class:`Comparison`, each difference with the search that
opens the selected requests having its value (:mod:`analytics.traces.drill`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import polars as pl

from fleetlens.analytics.attribution.context import with_gpu
from fleetlens.analytics.attribution.dimensions import add_buckets, compare_dimensions
from fleetlens.analytics.traces import compare_rank as rank
from fleetlens.analytics.traces.attr_sql import match_traces
from fleetlens.analytics.traces.drill import drill_query
from fleetlens.analytics.traces.heatmap import METRICS
from fleetlens.analytics.traces.query import SearchError, TraceQuery
from fleetlens.analytics.traces.search import where
from fleetlens.analytics.traces.sql import Params, describe, quote
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

if TYPE_CHECKING:
    import duckdb

    from fleetlens.pipeline.storage import DataDir

#: Dimensions compared: attribution's defaults plus the service (a search may span several).
DIMENSIONS = (c.HOST_NAME, c.GPU_UUID, c.INSTANCE_ID, c.SERVICE_NAME, c.MODEL, c.REGION,
              c.DEVICE_TYPE, c.GPU_MODEL, c.LORA, c.FINISH_REASON)
#: Columns a comparison reads besides the dimensions.
_COLUMNS = (c.TRACE_ID, c.REQUEST_ID, c.ARRIVAL_NS, *METRICS, c.INPUT_TOKENS, c.OUTPUT_TOKENS,
            c.CACHED_TOKENS)
#: Trace ids listed per difference (its slowest selected requests).
TRACE_IDS = 5


@dataclass(frozen=True)
class Selection:
    """Requests arriving in ``[start_ns, end_ns)`` with ``low <= metric <= high`` (a missing
    bound: no limit on that side)."""

    metric: str
    start_ns: int
    end_ns: int
    low: float | None = None
    high: float | None = None

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise SearchError(f"--metric {self.metric}: one of {', '.join(METRICS)}")
        if self.start_ns >= self.end_ns:
            raise SearchError("the selection's time span is empty: --from is not before --to")
        if None not in (self.low, self.high) and self.low > self.high:  # type: ignore[operator]
            raise SearchError(f"--min-latency {self.low:g} is above --max-latency "
                              f"{self.high:g}: nothing can be selected")

    def mask(self) -> pl.Expr:
        """The selected rows of a requests frame."""
        arrival, value = pl.col(c.ARRIVAL_NS), pl.col(self.metric)
        expr = (arrival >= self.start_ns) & (arrival < self.end_ns) & value.is_not_null()
        if self.low is not None:
            expr &= value >= self.low
        if self.high is not None:
            expr &= value <= self.high
        return expr


@dataclass(frozen=True)
class Difference:
    """One dimension value that stands out in the selection."""

    dimension: str
    value: str
    #: share of the selected requests / of the rest's requests with the value
    selected_share: float
    rest_share: float
    lift: float
    share_of_excess: float
    score: float
    #: the search opening the selected requests with this value (None: no filter for it)
    query: TraceQuery | None
    trace_ids: tuple[str, ...]
    #: other ``dimension=value`` selecting exactly the same requests of the view
    same_as: tuple[str, ...] = ()
    #: the GPUs of the instance it names (itself or one of ``same_as``)
    gpus: tuple[str, ...] = ()
    #: its share of the requests in the same band outside the span (None: too few there)
    outside_share: float | None = None

    @property
    def at_any_time(self) -> bool:
        """The band holds the value as much outside the span as in it: it describes the
        band (long prompts are slow at any time), not what happened in the span."""
        return self.outside_share is not None and self.selected_share <= self.outside_share

    def note(self) -> str:
        """What else the difference is: the same requests' other names, its instance's
        GPUs, and whether the band holds it at any time."""
        parts = [f"same requests as {', '.join(self.same_as)}"] if self.same_as else []
        if self.gpus:
            parts.append(f"on {'GPU' if len(self.gpus) == 1 else 'GPUs'} "
                         f"{' '.join(self.gpus)}")
        if self.at_any_time:
            parts.append(f"as common in this band outside the span ({self.outside_share:.0%})")
        return "; ".join(parts)


@dataclass(frozen=True)
class Comparison:
    """The selection against the rest of the view, top differences first."""

    selection: Selection
    selected: int
    rest: int
    differences: list[Difference]


def view_frame(con: duckdb.DuckDBPyConnection, query: TraceQuery) -> pl.DataFrame:
    """Every request ``query`` selects (sort and page ignored), with the columns a heatmap
    and a comparison read, and ``gpu_uuid`` where the instance ran on one GPU.

    Raises:
        SearchError: a filter the data cannot answer.
    """
    cursor = con.cursor()  # a cursor of its own: attribute matches are a temporary table
    try:
        frame = _select(cursor, query, [*_COLUMNS, *DIMENSIONS])
        mapping = cursor.sql(
            f"SELECT DISTINCT {quote(c.INSTANCE_ID)}, {quote(c.GPU_UUID)} FROM "
            f"{quote(t.INSTANCE_GPUS)} WHERE coalesce({quote(c.GPU_UUID)}, '') <> ''"
        ).pl() if _has(cursor, t.INSTANCE_GPUS) else pl.DataFrame()
    finally:
        cursor.close()
    if not mapping.height:
        return frame
    return rank.with_instance_gpus(with_gpu(frame, mapping), mapping)


def view_metric(con: duckdb.DuckDBPyConnection, query: TraceQuery, metric: str) -> pl.DataFrame:
    """The same requests as :func:`view_frame` with only ``arrival_ns`` and ``metric``: what a
    heatmap reads. Over a day of 2.2M requests 0.08 s against 1.1-1.5 s for the whole view,
    which a page then reads only once a selection asks for a comparison.

    Raises:
        SearchError: a filter the data cannot answer, or ``metric`` not a latency metric.
    """
    if metric not in METRICS:
        raise SearchError(f"{metric!r} is not one of {', '.join(METRICS)}")
    cursor = con.cursor()
    try:
        return _select(cursor, query, [c.ARRIVAL_NS, metric])
    finally:
        cursor.close()


def _select(cursor: duckdb.DuckDBPyConnection, query: TraceQuery,
            names: list[str]) -> pl.DataFrame:
    """``names`` (those ``requests`` has) of every request ``query`` selects."""
    columns = describe(cursor, t.REQUESTS)
    bind = Params()
    condition = where(query, columns, bind)
    if query.attrs or query.span_names:
        condition = f"{condition} AND {match_traces(cursor, query)}"
    wanted = [n for n in dict.fromkeys(names) if n in columns]
    return cursor.sql(
        f"SELECT {', '.join(f'r.{quote(n)}' for n in wanted)} FROM "
        f"{quote(t.REQUESTS)} r WHERE {condition}", params=bind.values).pl()


def _has(cursor: duckdb.DuckDBPyConnection, table: str) -> bool:
    # fetchall: a result left unfinished blocks the cursor's next query
    return bool(cursor.execute("SELECT count(*) FROM duckdb_views() WHERE view_name = ?",
                               [t.table(table).name]).fetchall()[0][0])


def compare(frame: pl.DataFrame, selection: Selection, query: TraceQuery | None = None,
            *, top: int = 10) -> Comparison:
    """What is different about ``selection``'s requests of ``frame`` from the rest.

    Args:
        frame: the view's requests (:func:`view_frame`).
        selection: the time span and latency band.
        query: the view's search; each difference's ``query`` narrows it to the selection
            and the value (``None``: no drill-down searches).
        top: differences returned at most (those with a lift above 1: the values the span
            has more of than the band outside it first, best score first within each).
    """
    inside = frame.filter(selection.mask())
    # The rest: every other request with a value of the metric (a one-token answer has no
    # TPOT, so it is in neither side of a TPOT comparison).
    rest = frame.filter(pl.col(selection.metric).is_not_null() & ~selection.mask())
    findings = [f for f in compare_dimensions(
        inside, rest, selection.metric, [d for d in DIMENSIONS if d in frame.columns],
        selected=True) if f.score > 0]
    ordered = rank.order(findings, rank.outside_shares(rank.outside_band(frame, selection),
                                                       findings))
    outside = {id(f): share for f, share in ordered}
    slowest = inside.sort(selection.metric, descending=True)
    diffs = []
    for group in rank.same_requests(
            lambda: add_buckets(pl.concat([inside, rest])), [f for f, _ in ordered])[:top]:
        f = group[0]
        matching = slowest.filter(_value_mask(slowest, f.dimension, f.value))
        diffs.append(Difference(
            f.dimension, f.value, f.slow_share, f.baseline_share, f.lift, f.share_of_excess,
            f.score, drill_query(query, selection, f.dimension, f.value) if query else None,
            tuple(matching[c.TRACE_ID].head(TRACE_IDS)),
            tuple(f"{g.dimension}={g.value}" for g in group[1:]),
            rank.instance_gpus(frame, group), outside[id(f)]))
    return Comparison(selection, inside.height, rest.height, diffs)


def _value_mask(frame: pl.DataFrame, dimension: str, value: str) -> pl.Series:
    if dimension in frame.columns:
        return frame[dimension].cast(pl.String) == value
    from fleetlens.analytics.attribution.dimensions import add_buckets

    return add_buckets(frame)[dimension] == value  # a prompt/output/cached-ratio bucket


def compare_data_dir(root: DataDir, query: TraceQuery, selection: Selection, *,
                     top: int = 10) -> Comparison:
    """:func:`compare` over the search ``query`` of a data directory (local or s3://)."""
    from fleetlens.analytics.traces.search import tables_for
    from fleetlens.pipeline.storage import connect

    con = connect(root, tables=(*tables_for(query), t.INSTANCE_GPUS))
    try:
        return compare(view_frame(con, query), selection, query, top=top)
    finally:
        con.close()
