"""A trace's requests with their energy, and what their instance did while they ran: the
engine's KV usage, batch (running) and queue (waiting), its GPUs' SM clock and power.

Input: ``requests`` and ``request_energy`` (joined on the request id), ``engine_samples``
(the request's host and instance), ``gpu_samples`` (the instance's GPUs from
``instance_gpus`` over the request's lifetime; without a mapping, every GPU of its host).
Output: plain frames for :mod:`.detail`. The samples are those within the request's
lifetime plus, per series, the last one before and the first one after it: a request shorter
than the sampling interval still gets the values on either side of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import polars as pl

from fleetlens.analytics.traces.sql import quote
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

if TYPE_CHECKING:
    import duckdb

NS = 1_000_000_000
#: How far outside a request's lifetime samples are looked for (the one on either side).
MARGIN_NS = 60 * NS
#: A request's arrival is within this of its trace's start (as lookup scans spans).
AROUND_NS = 3600 * NS
#: The requests of one trace that get signals (a fan-out trace would fetch them all).
MAX_REQUESTS = 8
#: Request columns shown, in order; energy columns follow.
REQUEST_COLUMNS = (c.REQUEST_ID, c.SPAN_ID, c.SERVICE_NAME, c.MODEL, c.HOST_NAME,
                   c.INSTANCE_ID, c.ARRIVAL_NS, c.END_NS, c.E2E_S, c.QUEUE_S, c.PREFILL_S,
                   c.DECODE_S, c.OVERHEAD_S, c.TTFT_S, c.TPOT_S, c.INPUT_TOKENS,
                   c.OUTPUT_TOKENS, c.CACHED_TOKENS, c.FINISH_REASON, c.IS_ERROR)
ENERGY_COLUMNS = (c.ENERGY_J, c.J_PER_TOKEN, c.ATTRIBUTION_COVERAGE)
#: The instance's signals: (table, column) in the order they are drawn.
ENGINE_SIGNALS = (c.KV_CACHE_USAGE, c.NUM_RUNNING, c.NUM_WAITING)
GPU_SIGNALS = (c.SM_CLOCK_MHZ, c.POWER_W)
SIGNALS_SCHEMA = {c.REQUEST_ID: pl.String, c.TS_NS: pl.Int64, "offset_ms": pl.Float64,
                  "signal": pl.String, "series": pl.String, "value": pl.Float64}


def _sql(con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any]) -> pl.DataFrame:
    cursor = con.cursor()  # the dashboard's connection is shared between sessions
    try:
        return cursor.sql(sql, params=params).pl()
    finally:
        cursor.close()


def _has(con: duckdb.DuckDBPyConnection, table: str) -> bool:
    name = t.table(table).name
    return bool(_sql(con, "SELECT 1 FROM duckdb_views() WHERE view_name = $n UNION ALL "
                          "SELECT 1 FROM duckdb_tables() WHERE table_name = $n",
                     {"n": name}).height)


def trace_requests(con: duckdb.DuckDBPyConnection, trace_id: str,
                   around_ns: int) -> pl.DataFrame:
    """The requests of ``trace_id`` arriving within an hour of ``around_ns``, in arrival
    order, with their ``energy_j``, ``j_per_token`` and ``attribution_coverage`` (null
    where the energy job has not attributed them)."""
    cols = ", ".join(f"r.{quote(n)}" for n in REQUEST_COLUMNS)
    if _has(con, t.REQUEST_ENERGY):
        energy = ", ".join(f"e.{quote(n)}" for n in ENERGY_COLUMNS)
        join = (f"LEFT JOIN (SELECT {quote(c.REQUEST_ID)}, "
                + ", ".join(f"any_value({quote(n)}) AS {quote(n)}" for n in ENERGY_COLUMNS)
                + f" FROM {quote(t.REQUEST_ENERGY)} WHERE {quote(c.REQUEST_ID)} IN (SELECT "
                f"{quote(c.REQUEST_ID)} FROM mine) GROUP BY 1) e USING ({quote(c.REQUEST_ID)})")
    else:
        energy = ", ".join(f"NULL::DOUBLE AS {quote(n)}" for n in ENERGY_COLUMNS)
        join = ""
    mine = (f"SELECT * FROM {quote(t.REQUESTS)} WHERE {quote(c.TRACE_ID)} = $id AND "
            f"{quote(c.ARRIVAL_NS)} BETWEEN $lo AND $hi")
    return _sql(con, f"WITH mine AS ({mine}) SELECT {cols}, {energy} FROM mine r {join} "
                     f"ORDER BY r.{quote(c.ARRIVAL_NS)}",
                {"id": trace_id, "lo": around_ns - AROUND_NS, "hi": around_ns + AROUND_NS})


def _gpu_filter(con: duckdb.DuckDBPyConnection, req: dict[str, Any]) -> str:
    """The instance's GPUs as a SQL condition on ``gpu_uuid`` (TRUE: every GPU of its host,
    where ``instance_gpus`` does not say)."""
    if not _has(con, t.INSTANCE_GPUS):
        return "TRUE"
    uuids = _sql(con, f"SELECT DISTINCT {quote(c.GPU_UUID)} FROM {quote(t.INSTANCE_GPUS)} "
                      f"WHERE {quote(c.HOST_NAME)} = $h AND {quote(c.INSTANCE_ID)} = $i AND "
                      f"coalesce({quote(c.GPU_UUID)}, '') <> '' AND "
                      f"coalesce({quote(c.START_NS)}, $end) <= $end AND "
                      f"coalesce({quote(c.END_NS)}, $arrival) >= $arrival",
                 {"h": req[c.HOST_NAME], "i": req[c.INSTANCE_ID], "end": req[c.END_NS],
                  "arrival": req[c.ARRIVAL_NS]})[c.GPU_UUID].to_list()
    if not uuids:
        return "TRUE"
    # uuids come from storage, not the user; quoted as SQL strings all the same
    return f"{quote(c.GPU_UUID)} IN ({', '.join(_literal(u) for u in uuids)})"


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _long(frame: pl.DataFrame, series: pl.Expr, signals: tuple[str, ...]) -> pl.DataFrame:
    return (frame.with_columns(series.alias("series"))
            .unpivot(list(signals), index=[c.TS_NS, "series"], variable_name="signal")
            .with_columns(pl.col("value").cast(pl.Float64)).drop_nulls("value"))


def _lifetime(frame: pl.DataFrame, arrival: int, end: int) -> pl.DataFrame:
    """Samples within ``[arrival, end]`` and, per series, the nearest one on either side."""
    ts = pl.col(c.TS_NS)
    by = ["signal", "series"]
    before = pl.when(ts < arrival).then(ts).max().over(by)
    after = pl.when(ts > end).then(ts).min().over(by)
    return frame.filter(ts.is_between(arrival, end) | (ts == before) | (ts == after))


def request_signals(con: duckdb.DuckDBPyConnection, requests: pl.DataFrame,
                    start_ns: int) -> pl.DataFrame:
    """Per request (the first :data:`MAX_REQUESTS`): its instance's engine signals and its
    GPUs' signals during its lifetime, long (:data:`SIGNALS_SCHEMA`), ``offset_ms`` since
    ``start_ns``."""
    parts = []
    for req in requests.head(MAX_REQUESTS).iter_rows(named=True):
        params = {"h": req[c.HOST_NAME], "lo": req[c.ARRIVAL_NS] - MARGIN_NS,
                  "hi": req[c.END_NS] + MARGIN_NS}
        near = f"{quote(c.HOST_NAME)} = $h AND {quote(c.TS_NS)} BETWEEN $lo AND $hi"
        engine = _sql(con, f"SELECT {quote(c.TS_NS)}, "
                           + ", ".join(quote(n) for n in ENGINE_SIGNALS)
                           + f" FROM {quote(t.ENGINE_SAMPLES)} WHERE {near} AND "
                           f"{quote(c.INSTANCE_ID)} = $i", {**params, "i": req[c.INSTANCE_ID]})
        gpus = _sql(con, f"SELECT {quote(c.TS_NS)}, {quote(c.GPU_UUID)}, "
                         + ", ".join(quote(n) for n in GPU_SIGNALS)
                         + f" FROM {quote(t.GPU_SAMPLES)} WHERE {near} AND "
                         f"{_gpu_filter(con, req)}", params)
        both = pl.concat([_long(engine, pl.lit(req[c.INSTANCE_ID]), ENGINE_SIGNALS),
                          _long(gpus, pl.col(c.GPU_UUID), GPU_SIGNALS)], how="diagonal")
        parts.append(_lifetime(both, req[c.ARRIVAL_NS], req[c.END_NS])
                     .with_columns(pl.lit(req[c.REQUEST_ID]).alias(c.REQUEST_ID)))
    if not parts:
        return pl.DataFrame(schema=SIGNALS_SCHEMA)
    return (pl.concat(parts, how="diagonal")
            .with_columns(((pl.col(c.TS_NS) - start_ns) / 1e6).round(3).alias("offset_ms"))
            .select(list(SIGNALS_SCHEMA)).cast(SIGNALS_SCHEMA)  # type: ignore[arg-type]
            .sort(c.REQUEST_ID, "signal", "series", c.TS_NS))
