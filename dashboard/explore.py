"""Queries behind the KV cache, Energy, Leaderboard and Trace explorer pages."""

from __future__ import annotations

import duckdb
import polars as pl

from fleetlens.dashboard.filters import Filters, table_columns, where
from fleetlens.dashboard.queries import run
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

NS = 1_000_000_000


def _bucket(con: duckdb.DuckDBPyConnection) -> str:
    """The time bucket (ns) of sample tables: the finest window size, 60 s without windows."""
    row = con.cursor().execute(f"SELECT min({c.WINDOW_S}) FROM {t.WINDOWS}").fetchall()[0]
    return str(int(row[0] or 60) * NS)


def kv_instances(con: duckdb.DuckDBPyConnection, f: Filters) -> pl.DataFrame:
    """Per instance and time bucket: KV usage, waiting, preemptions and prefix hit rate."""
    clause, params = where(con, f, time_col=c.TS_NS)
    b = _bucket(con)
    sql = f"""
        WITH s AS (SELECT *, ({c.TS_NS} // {b}) * {b} AS bucket FROM {t.ENGINE_SAMPLES}
                   WHERE {clause}),
             g AS (SELECT bucket AS {c.TS_NS}, {c.HOST_NAME}, {c.INSTANCE_ID}, {c.MODEL},
                          avg({c.KV_CACHE_USAGE}) AS kv_usage, max({c.KV_CACHE_USAGE}) AS kv_max,
                          avg({c.NUM_WAITING}) AS waiting,
                          max({c.PREEMPTIONS_TOTAL}) AS pre, max({c.PREFIX_CACHE_HITS_TOTAL}) AS h,
                          max({c.PREFIX_CACHE_QUERIES_TOTAL}) AS q
                   FROM s GROUP BY ALL)
        SELECT {c.TS_NS}, {c.HOST_NAME}, {c.INSTANCE_ID}, {c.MODEL}, kv_usage, kv_max, waiting,
               greatest(pre - lag(pre) OVER w, 0) AS preemptions,
               greatest(h - lag(h) OVER w, 0) / nullif(greatest(q - lag(q) OVER w, 0), 0)
                   AS {c.PREFIX_HIT_RATE}
        FROM g WINDOW w AS (PARTITION BY {c.INSTANCE_ID} ORDER BY {c.TS_NS})
        ORDER BY {c.TS_NS}, {c.INSTANCE_ID}"""
    return run(con, sql, params)


def kv_summary(con: duckdb.DuckDBPyConnection, f: Filters) -> pl.DataFrame:
    """Per instance, as ``analytics.kvcache.kv_summary`` computes it: usage mean/p95/max,
    headroom (1 - p95), preemptions (reset-aware), prefix hit rate and KV capacity."""
    from fleetlens.analytics.kvcache import kv_summary as analytics_kv_summary
    from fleetlens.dashboard.ranking import analytics_config

    clause, params = where(con, f, time_col=c.TS_NS)
    engine = run(con, f"SELECT * FROM {t.ENGINE_SAMPLES} WHERE {clause}", params)
    if engine.is_empty():
        return engine
    mapping = run(con, f"SELECT DISTINCT {c.INSTANCE_ID}, {c.GPU_UUID} FROM {t.INSTANCE_GPUS}",
                  {})
    gpus = run(con, f"SELECT {c.HOST_NAME}, any_value({c.GPU_MODEL}) AS {c.GPU_MODEL} "
                    f"FROM {t.GPU_SAMPLES} GROUP BY 1", {})
    return analytics_kv_summary(engine, mapping, dict(gpus.iter_rows()),
                                analytics_config()).sort("kv_usage_max", descending=True)


def kv_vs_latency(con: duckdb.DuckDBPyConnection, f: Filters) -> pl.DataFrame:
    """Host windows: KV usage against queue time and TTFT p99 (the pressure link)."""
    clause, params = where(con, f, time_col=c.WINDOW_START_NS)
    params["fleet"] = t.FLEET_WIDE
    cols = ", ".join((c.WINDOW_START_NS, c.HOST_NAME, c.MODEL, c.KV_CACHE_USAGE_MEAN,
                      c.percentile_column("queue", "p99"), c.percentile_column("ttft", "p99")))
    return run(con, f"SELECT {cols} FROM {t.WINDOWS} WHERE {clause} AND {c.HOST_NAME} <> $fleet"
                    f" AND {c.KV_CACHE_USAGE_MEAN} IS NOT NULL", params)


def energy_by(con: duckdb.DuckDBPyConnection, f: Filters, dim: str) -> pl.DataFrame:
    """J/token and power per window for each value of ``dim`` (model or host)."""
    if dim not in (c.MODEL, c.HOST_NAME, c.SERVICE_NAME):
        raise ValueError(f"cannot group energy by {dim!r}")
    clause, params = where(con, f, time_col=c.WINDOW_START_NS)
    params["fleet"] = t.FLEET_WIDE
    return run(con, f"""SELECT {c.WINDOW_START_NS}, {dim}, sum({c.POWER_W}) AS {c.POWER_W},
            sum({c.ENERGY_J}) AS {c.ENERGY_J}, sum({c.OUTPUT_TOKENS})::DOUBLE AS {c.OUTPUT_TOKENS},
            sum({c.ENERGY_J}) / nullif(sum({c.OUTPUT_TOKENS}), 0) AS {c.J_PER_TOKEN}
        FROM {t.WINDOWS} WHERE {clause} AND {c.HOST_NAME} <> $fleet GROUP BY ALL ORDER BY 1""",
               params)


def power_vs_limit(con: duckdb.DuckDBPyConnection, f: Filters) -> pl.DataFrame:
    """Per host: mean and peak power against the summed power limit of its GPUs.

    The peak is that of the host's total power (its GPUs' 1-second means added up second by
    second), comparable with the summed limit; adding each GPU's own peak, reached at
    different moments, would show hosts above a limit they never reached.
    """
    clause, params = where(con, f, time_col=c.TS_NS, dims=(c.HOST_NAME,))
    return run(con, f"""
        WITH g AS (SELECT {c.HOST_NAME}, {c.GPU_UUID}, any_value({c.GPU_MODEL}) AS {c.GPU_MODEL},
                          avg({c.POWER_W}) AS mean_w, avg({c.POWER_LIMIT_W}) AS limit_w,
                          avg(({c.UTIL_GPU} < 0.05)::INT) AS idle_share
                   FROM {t.GPU_SAMPLES} WHERE {clause} GROUP BY 1, 2),
             per_second AS (SELECT {c.HOST_NAME}, {c.GPU_UUID}, {c.TS_NS} // 1000000000 AS s,
                                   avg({c.POWER_W}) AS w
                            FROM {t.GPU_SAMPLES} WHERE {clause} GROUP BY 1, 2, 3),
             peak AS (SELECT {c.HOST_NAME}, max(w) AS peak_power_w
                      FROM (SELECT {c.HOST_NAME}, s, sum(w) AS w FROM per_second GROUP BY 1, 2)
                      GROUP BY 1)
        SELECT {c.HOST_NAME}, any_value({c.GPU_MODEL}) AS {c.GPU_MODEL}, count(*) AS gpus,
               sum(mean_w) AS mean_power_w, any_value(peak.peak_power_w) AS peak_power_w,
               sum(limit_w) AS power_limit_w, avg(idle_share) AS idle_share
        FROM g JOIN peak USING ({c.HOST_NAME}) GROUP BY 1 ORDER BY mean_power_w DESC""", params)


def request_energy(con: duckdb.DuckDBPyConnection, f: Filters) -> pl.DataFrame:
    """Per host: attributed request energy, J/token quantiles and attribution coverage.

    Reads ``request_energy`` alone (no join with ``requests``), so it covers every retained
    request of the hosts in scope, not only the time range.
    """
    clause, params = where(con, f, time_col=None, dims=(c.HOST_NAME,))
    return run(con, f"""
        SELECT {c.HOST_NAME}, count(*) AS requests, sum({c.ENERGY_J}) AS {c.ENERGY_J},
               quantile_cont({c.J_PER_TOKEN}, 0.5) AS j_per_token_p50,
               quantile_cont({c.J_PER_TOKEN}, 0.9) AS j_per_token_p90,
               avg({c.ATTRIBUTION_COVERAGE}) AS coverage
        FROM {t.REQUEST_ENERGY} WHERE {clause} GROUP BY 1 ORDER BY 1""", params)


def find_trace(con: duckdb.DuckDBPyConnection, ident: str,
               around_ns: int | None = None) -> pl.DataFrame:
    """Spans of the trace with id ``ident``, or of the request with id ``ident``.

    Ids have no index, so a lookup scans the id column; ``around_ns`` (a time the trace
    overlaps, e.g. the request's arrival from a link) limits the scan to an hour either side,
    which Parquet statistics and the hour partitions turn into a few row groups.
    """
    ident = ident.strip()
    trace_id = ident.lower()
    if not _is_trace_id(trace_id):
        trace_id = _trace_of_request(con, ident, around_ns)
        if trace_id is None:
            return t.table(t.SPANS).empty().select(_SPAN_COLS)
    window, params = _near(c.START_NS, around_ns)
    params["id"] = trace_id
    return run(con, f"""SELECT {', '.join(_SPAN_COLS)} FROM {t.SPANS}
        WHERE {window} AND {c.TRACE_ID} = $id ORDER BY {c.START_NS}""", params)


_SPAN_COLS = [c.TRACE_ID, c.SPAN_ID, c.PARENT_SPAN_ID, c.NAME, c.SERVICE_NAME, c.HOST_NAME,
              c.START_NS, c.END_NS, c.STATUS_CODE]


def _near(column: str, around_ns: int | None) -> tuple[str, dict[str, int]]:
    """A clause keeping ``column`` within an hour of ``around_ns`` (TRUE without one)."""
    if around_ns is None:
        return "TRUE", {}
    return (f"{column} BETWEEN $lo AND $hi",
            {"lo": around_ns - 3600 * NS, "hi": around_ns + 3600 * NS})


def _is_trace_id(text: str) -> bool:
    return len(text) == 32 and all(ch in "0123456789abcdef" for ch in text)


def _trace_of_request(con: duckdb.DuckDBPyConnection, request_id: str,
                      around_ns: int | None) -> str | None:
    """The trace of a request id: from ``requests``, else from the spans' promoted column."""
    window, params = _near(c.ARRIVAL_NS, around_ns)
    params["id"] = request_id
    found = run(con, f"SELECT {c.TRACE_ID} FROM {t.REQUESTS} WHERE {window} "
                     f"AND {c.REQUEST_ID} = $id LIMIT 1", params)
    if found.height:
        return found[c.TRACE_ID][0]
    if c.GEN_AI_REQUEST_ID not in table_columns(con, t.SPANS):
        return None
    found = run(con, f"SELECT {c.TRACE_ID} FROM {t.SPANS} WHERE {c.GEN_AI_REQUEST_ID} = $id "
                     "LIMIT 1", {"id": request_id})
    return found[c.TRACE_ID][0] if found.height else None


def trace_requests(con: duckdb.DuckDBPyConnection, trace_id: str,
                   around_ns: int | None = None) -> pl.DataFrame:
    """The requests (engine spans) of a trace with their phases."""
    window, params = _near(c.ARRIVAL_NS, around_ns)
    params["id"] = trace_id
    return run(con, f"""SELECT {c.REQUEST_ID}, {c.SPAN_ID}, {c.ARRIVAL_NS}, {c.QUEUE_S},
            {c.PREFILL_S}, {c.DECODE_S}, {c.TTFT_S}, {c.E2E_S}, {c.INPUT_TOKENS},
            {c.OUTPUT_TOKENS}, {c.MODEL}, {c.HOST_NAME}
        FROM {t.REQUESTS} WHERE {window} AND {c.TRACE_ID} = $id""", params)


def waterfall(spans: pl.DataFrame, reqs: pl.DataFrame) -> pl.DataFrame:
    """Bars of the waterfall: every span, and inside each engine span its phases.

    Returns rows ``label, kind (span|queue|prefill|decode), start_ms, duration_ms, depth``
    with times relative to the trace start; phases are laid end to end from the engine
    span's start (vLLM's arrival), as vLLM defines them.
    """
    if spans.is_empty():
        return pl.DataFrame(schema={"label": pl.String, "kind": pl.String,
                                    "start_ms": pl.Float64, "duration_ms": pl.Float64})
    t0 = spans[c.START_NS].min()
    rows = []
    phases = {r[c.SPAN_ID]: r for r in reqs.iter_rows(named=True)}
    for s in spans.iter_rows(named=True):
        label = f"{s[c.NAME]} ({s[c.SERVICE_NAME]} @ {s[c.HOST_NAME]})"
        start = (s[c.START_NS] - t0) / 1e6
        rows.append((label, "span", start, (s[c.END_NS] - s[c.START_NS]) / 1e6))
        req = phases.get(s[c.SPAN_ID])
        if req is None:
            continue
        offset = start
        for kind, col in (("queue", c.QUEUE_S), ("prefill", c.PREFILL_S),
                          ("decode", c.DECODE_S)):
            dur = (req[col] or 0.0) * 1e3
            rows.append((label, kind, offset, dur))
            offset += dur
    return pl.DataFrame(rows, schema=["label", "kind", "start_ms", "duration_ms"], orient="row")


def slow_requests(con: duckdb.DuckDBPyConnection, f: Filters, limit: int = 15) -> pl.DataFrame:
    """The slowest requests in range and scope (starting points for the trace explorer)."""
    clause, params = where(con, f, time_col=c.ARRIVAL_NS)
    params["n"] = limit
    cols = ", ".join((c.REQUEST_ID, c.TRACE_ID, c.SERVICE_NAME, c.MODEL, c.HOST_NAME,
                      c.ARRIVAL_NS, c.E2E_S, c.QUEUE_S, c.PREFILL_S, c.DECODE_S))
    return run(con, f"SELECT {cols} FROM {t.REQUESTS} WHERE {clause} "
                    f"ORDER BY {c.E2E_S} DESC LIMIT $n", params)
