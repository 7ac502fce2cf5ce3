"""Read-only queries behind the overview, incidents and baselines pages.

Each function takes a DuckDB connection (from :func:`pipeline.storage.connect`) and
:class:`~dashboard.filters.Filters` and returns a small Polars frame. They read the
pre-aggregated ``windows`` table (never per-request rows) so a page stays fast on a day of a
large fleet. Streamlit caching lives in :mod:`dashboard.data`, not here, so the benchmark and
tests call these directly.
"""

from __future__ import annotations

from typing import Any

import duckdb
import polars as pl

from fleetlens.dashboard.filters import Filters, table_columns, where
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

#: The headline latency columns of the overview: (label, windows column).
HEADLINE = tuple(
    (f"{metric.upper()} {suffix}", c.percentile_column(metric, suffix))
    for metric in ("ttft", "tpot", "e2e") for suffix in ("p50", "p99")
)
#: The baseline method drawn on the overview and incident pages: the rolling baseline is
#: always on for every series (Prophet bands are on the Baselines page).
OVERVIEW_METHOD = "rolling"
#: Rate columns summed over series; every other value column is a request-weighted mean.
RATES = (c.RPS, c.OUTPUT_TOK_S, c.POWER_W, c.REQUESTS, c.INPUT_TOKENS, c.OUTPUT_TOKENS,
         c.ENERGY_J, c.PREEMPTIONS)
WEIGHTED = (*(col for _, col in HEADLINE), c.ERROR_RATE, c.KV_CACHE_USAGE_MEAN,
            c.PREFIX_HIT_RATE, c.percentile_column("queue", "p99"))


def run(con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any]) -> pl.DataFrame:
    """Execute ``sql`` with bound ``params`` on a fresh cursor (safe across threads)."""
    cursor = con.cursor()
    try:
        return cursor.sql(sql, params=params or None).pl()
    finally:
        cursor.close()


def extent(con: duckdb.DuckDBPyConnection) -> tuple[int | None, int | None]:
    """First window start and last window end in the data (ns), or ``(None, None)``."""
    row = con.cursor().execute(
        f"SELECT min({c.WINDOW_START_NS}), max({c.WINDOW_START_NS} + {c.WINDOW_S} * 1e9)"
        f" FROM {t.WINDOWS}").fetchall()[0]
    return (int(row[0]), int(row[1])) if row[0] is not None else (None, None)


def options(con: duckdb.DuckDBPyConnection) -> dict[str, list[str]]:
    """Distinct services, models, hosts and regions to offer in the filters."""
    out: dict[str, list[str]] = {}
    for column in (c.SERVICE_NAME, c.MODEL, c.HOST_NAME):
        rows = con.cursor().execute(
            f"SELECT DISTINCT {column} FROM {t.WINDOWS} WHERE {column} <> $fleet ORDER BY 1",
            {"fleet": t.FLEET_WIDE}).fetchall()
        out[column] = [r[0] for r in rows if r[0] is not None]
    out[c.REGION] = []
    if c.REGION in table_columns(con, t.REQUESTS):
        rows = con.cursor().execute(
            f"SELECT DISTINCT {c.REGION} FROM {t.REQUESTS} ORDER BY 1").fetchall()
        out[c.REGION] = [r[0] for r in rows if r[0] is not None]
    return out


def scope_hosts(con: duckdb.DuckDBPyConnection) -> list[tuple[str, str, str]]:
    """Distinct (service, model, host) served in the data: the hosts a scope offers."""
    rows = con.cursor().execute(
        f"SELECT DISTINCT {c.SERVICE_NAME}, {c.MODEL}, {c.HOST_NAME} FROM {t.WINDOWS} "
        f"WHERE {c.HOST_NAME} <> $fleet AND {c.SERVICE_NAME} <> $fleet AND {c.MODEL} <> $fleet "
        "ORDER BY 1, 2, 3", {"fleet": t.FLEET_WIDE}).fetchall()
    return [tuple(r) for r in rows]


def _window_rows(con: duckdb.DuckDBPyConnection, f: Filters) -> tuple[str, dict[str, Any]]:
    """WHERE clause for the ``windows`` rows matching ``f`` at the finest window size.

    Without a host filter the fleet-wide rows (host ``*``) are used, else the host rows.
    """
    clause, params = where(con, f, time_col=c.WINDOW_START_NS)
    params["fleet"] = t.FLEET_WIDE
    size = f"{c.WINDOW_S} = (SELECT min({c.WINDOW_S}) FROM {t.WINDOWS})"
    return f"{clause} AND {_level(f)} AND {size}", params


def _level(f: Filters) -> str:
    """Rows of one level only: per host (host filter set) or per service/model, never the
    all-fleet rollups (service or model ``*``), so sums count every request once."""
    host = f"{c.HOST_NAME} <> $fleet" if f.by_host else f"{c.HOST_NAME} = $fleet"
    return f"{host} AND {c.SERVICE_NAME} <> $fleet AND {c.MODEL} <> $fleet"


def _combine(group: str) -> str:
    sums = [f"sum({col}) AS {col}" for col in RATES]
    means = [f"sum({col} * {c.REQUESTS}) / nullif(sum({c.REQUESTS}), 0) AS {col}"
             for col in WEIGHTED]
    jpt = f"sum({c.ENERGY_J}) / nullif(sum({c.OUTPUT_TOKENS}), 0) AS {c.J_PER_TOKEN}"
    return f"SELECT {group}, {', '.join(sums + means)}, {jpt}"


def fleet_series(con: duckdb.DuckDBPyConnection, f: Filters) -> pl.DataFrame:
    """One row per window: rates summed, J/token, and latency percentiles of the requests.

    Windows rows are per service and model: when the scope holds several, a mean of their
    p99s is not a p99, so the percentiles come from the requests of each window (exact, as
    the pipeline computes them for one row).
    """
    clause, params = _window_rows(con, f)
    rows = run(con, f"{_combine(c.WINDOW_START_NS)} FROM {t.WINDOWS} WHERE {clause} "
                    f"GROUP BY 1 ORDER BY 1", params)
    if rows.is_empty():
        return rows
    exact = window_percentiles(con, f, _window_s(con))
    return rows.drop(exact.columns[1:]).join(exact, on=c.WINDOW_START_NS, how="left")


def scope_series(con: duckdb.DuckDBPyConnection, f: Filters) -> list[tuple[str, str, str]]:
    """The (service, model, host) series :func:`fleet_series` combines for ``f``: host
    ``*`` rows per service and model, or the host rows under a host filter."""
    clause, params = _window_rows(con, f)
    rows = run(con, f"SELECT DISTINCT {c.SERVICE_NAME}, {c.MODEL}, {c.HOST_NAME} "
                    f"FROM {t.WINDOWS} WHERE {clause} ORDER BY 1, 2, 3", params)
    return [tuple(r) for r in rows.iter_rows()]


def error_series(con: duckdb.DuckDBPyConnection, f: Filters) -> pl.DataFrame:
    """Per window and service: requests, failed requests and the error rate (the windows'
    ``error_rate`` weighted by their requests), for the availability page."""
    clause, params = _window_rows(con, f)
    return run(con, f"""SELECT {c.WINDOW_START_NS}, {c.SERVICE_NAME},
            sum({c.REQUESTS})::BIGINT AS {c.REQUESTS},
            sum({c.ERROR_RATE} * {c.REQUESTS}) AS failed,
            sum({c.ERROR_RATE} * {c.REQUESTS}) / nullif(sum({c.REQUESTS}), 0) AS {c.ERROR_RATE}
        FROM {t.WINDOWS} WHERE {clause} GROUP BY 1, 2 ORDER BY 1, 2""", params)


def _window_s(con: duckdb.DuckDBPyConnection) -> int:
    row = con.cursor().execute(f"SELECT min({c.WINDOW_S}) FROM {t.WINDOWS}").fetchall()[0]
    return int(row[0] or 60)


def _latency_aggs() -> str:
    """quantile_cont of each headline latency column over the requests, as windows name it."""
    parts = []
    for _, col in HEADLINE:
        source = c.request_latency_column(col)
        q = dict(c.PERCENTILES)[col.split("_")[1]]
        parts.append(f"quantile_cont({source}, {q}) AS {col}")
    return ", ".join(parts)


def window_percentiles(con: duckdb.DuckDBPyConnection, f: Filters, window_s: int
                       ) -> pl.DataFrame:
    """Headline latency percentiles per window, from the requests in range and scope."""
    clause, params = where(con, f, time_col=c.ARRIVAL_NS)
    step = window_s * 1_000_000_000
    return run(con, f"""SELECT ({c.ARRIVAL_NS} // {step}) * {step} AS {c.WINDOW_START_NS},
                   {_latency_aggs()} FROM {t.REQUESTS} WHERE {clause} GROUP BY 1 ORDER BY 1""",
               params)


def series_percentiles(con: duckdb.DuckDBPyConnection, f: Filters) -> pl.DataFrame:
    """Headline latency percentiles per window and series (``series``: ``service / model``,
    plus ``/ host`` under a host filter), from the requests: the overview draws one line
    per series when the scope holds several models."""
    clause, params = where(con, f, time_col=c.ARRIVAL_NS)
    step = _window_s(con) * 1_000_000_000
    parts = [c.SERVICE_NAME, c.MODEL, *([c.HOST_NAME] if f.by_host else [])]
    label = " || ' / ' || ".join(f"coalesce({p}, '?')" for p in parts)
    return run(con, f"""SELECT ({c.ARRIVAL_NS} // {step}) * {step} AS {c.WINDOW_START_NS},
                   {label} AS series, {_latency_aggs()} FROM {t.REQUESTS} WHERE {clause}
                   GROUP BY 1, 2 ORDER BY 1, 2""", params)


def range_percentiles(con: duckdb.DuckDBPyConnection, f: Filters) -> dict[str, float | None]:
    """Headline latency percentiles of all the requests in ``f``'s range and scope."""
    clause, params = where(con, f, time_col=c.ARRIVAL_NS)
    return run(con, f"SELECT {_latency_aggs()} FROM {t.REQUESTS} WHERE {clause}",
               params).row(0, named=True)


def host_ranking(con: duckdb.DuckDBPyConnection, f: Filters) -> pl.DataFrame:
    """Hosts ranked by trouble: incidents in range, then p99 e2e against the fleet median.

    A host's p99 e2e is that of its requests in range (``quantile_cont``), not a mean of
    its windows' p99s; requests/s is its requests over the seconds of data in range.
    """
    clause, params = where(con, f, time_col=c.WINDOW_START_NS)
    params["fleet"] = t.FLEET_WIDE
    e2e = c.percentile_column("e2e", "p99")
    r_clause, r_params = where(con, f, time_col=c.ARRIVAL_NS, prefix="r_")
    inc_clause, inc_params = where(con, f, time_col=c.START_NS, end_col=c.END_NS, prefix="i_")
    params.update(r_params)
    params.update(inc_params)
    sql = f"""
        WITH h AS (SELECT {c.HOST_NAME},
                          sum({c.KV_CACHE_USAGE_MEAN} * {c.REQUESTS})
                              / nullif(sum({c.REQUESTS}), 0) AS {c.KV_CACHE_USAGE_MEAN},
                          sum({c.ENERGY_J}) / nullif(sum({c.OUTPUT_TOKENS}), 0)
                              AS {c.J_PER_TOKEN}
                   FROM {t.WINDOWS} WHERE {clause} AND {c.HOST_NAME} <> $fleet
                   AND {c.SERVICE_NAME} <> $fleet AND {c.MODEL} <> $fleet GROUP BY 1),
             span AS (SELECT (max({c.WINDOW_START_NS}) - min({c.WINDOW_START_NS})) / 1e9
                             + max({c.WINDOW_S}) AS seconds
                      FROM {t.WINDOWS} WHERE {clause}),
             r AS (SELECT {c.HOST_NAME}, count(*) AS {c.REQUESTS},
                          quantile_cont({c.E2E_S}, 0.99) AS {e2e},
                          avg({c.IS_ERROR}::DOUBLE) AS {c.ERROR_RATE}
                   FROM {t.REQUESTS} WHERE {r_clause} GROUP BY 1),
             i AS (SELECT {c.HOST_NAME}, count(*) AS incidents FROM {t.INCIDENTS}
                   WHERE {inc_clause} GROUP BY 1)
        SELECT r.{c.HOST_NAME}, coalesce(i.incidents, 0) AS incidents,
               r.{e2e}, r.{e2e} / nullif(median(r.{e2e}) OVER (), 0) AS e2e_vs_fleet,
               h.{c.KV_CACHE_USAGE_MEAN}, r.{c.ERROR_RATE},
               r.{c.REQUESTS} / nullif((SELECT seconds FROM span), 0) AS {c.RPS},
               h.{c.J_PER_TOKEN}
        FROM r LEFT JOIN h USING ({c.HOST_NAME}) LEFT JOIN i USING ({c.HOST_NAME})
        ORDER BY incidents DESC, e2e_vs_fleet DESC NULLS LAST"""
    return run(con, sql, params)


def baseline_rows(con: duckdb.DuckDBPyConnection) -> str:
    """SQL of the baselines normalised to ``metric, service, model, host, ts, band`` columns.

    Analytics writes those as columns beside the series name; when they are absent they are
    parsed from the name, ``metric{service_name=a,model=b,host_name=c}`` (missing keys are
    the fleet-wide ``*``).
    """
    cols = table_columns(con, t.BASELINES)
    select = [c.METRIC if c.METRIC in cols else f"split_part({c.SERIES}, '{{', 1) AS {c.METRIC}"]
    for key in (c.SERVICE_NAME, c.MODEL, c.HOST_NAME):
        parsed = (f"coalesce(nullif(regexp_extract({c.SERIES}, '[{{,]{key}=([^,}}]*)', 1), ''),"
                  f" '{t.FLEET_WIDE}') AS {key}")
        select.append(key if key in cols else parsed)
    return (f"SELECT {c.SERIES}, {', '.join(select)}, {c.TS_NS}, {c.EXPECTED}, {c.LOWER}, "
            f"{c.UPPER}, {c.METHOD} FROM {t.BASELINES}")


def fleet_band(con: duckdb.DuckDBPyConnection, f: Filters, metric: str) -> pl.DataFrame:
    """The baseline band of ``metric`` for the rows :func:`fleet_series` shows.

    Bands of several series combine like their values: rates add up, everything else is
    weighted by the requests of the series' window (as :func:`fleet_series` weights values).
    """
    clause, params = where(con, f, time_col=c.TS_NS, prefix="b_")
    w_clause, w_params = _window_rows(con, f)
    params.update(w_params)
    params.update({"metric": metric, "method": OVERVIEW_METHOD})
    keys = (c.SERVICE_NAME, c.MODEL, c.HOST_NAME)
    join = " AND ".join(f"b.{k} = w.{k}" for k in keys)
    if metric in RATES:
        parts = [f"sum(b.{col}) AS {col}" for col in (c.EXPECTED, c.LOWER, c.UPPER)]
    else:
        parts = [f"sum(b.{col} * w.{c.REQUESTS}) / nullif(sum(w.{c.REQUESTS}), 0) AS {col}"
                 for col in (c.EXPECTED, c.LOWER, c.UPPER)]
    sql = f"""SELECT b.{c.TS_NS}, {', '.join(parts)}
              FROM (SELECT * FROM ({baseline_rows(con)}) WHERE {clause}
                    AND {c.METRIC} = $metric AND {c.METHOD} = $method) b
              JOIN (SELECT * FROM {t.WINDOWS} WHERE {w_clause}) w
                ON b.{c.TS_NS} = w.{c.WINDOW_START_NS} AND {join}
              GROUP BY 1 ORDER BY 1"""
    return run(con, sql, params)


def incidents(con: duckdb.DuckDBPyConnection, f: Filters) -> pl.DataFrame:
    """Incidents overlapping the range in scope, newest first, with their top cause."""
    clause, params = where(con, f, time_col=c.START_NS, end_col=c.END_NS)
    sql = f"""
        SELECT i.*, top.{c.CAUSE}, top.{c.SUBJECT}, top.{c.SUMMARY}, top.{c.SHARE_OF_EXCESS}
        FROM (SELECT * FROM {t.INCIDENTS} WHERE {clause}) i
        LEFT JOIN (SELECT * FROM {t.CAUSES} WHERE {c.RANK} = 1) top USING ({c.INCIDENT_ID})
        ORDER BY i.{c.START_NS} DESC"""
    return run(con, sql, params)


def causes(con: duckdb.DuckDBPyConnection, incident_id: str) -> pl.DataFrame:
    """The ranked causes of one incident."""
    return run(con, f"SELECT * FROM {t.CAUSES} WHERE {c.INCIDENT_ID} = $id ORDER BY {c.RANK}",
               {"id": incident_id})


def baseline_series(con: duckdb.DuckDBPyConnection, f: Filters) -> pl.DataFrame:
    """The distinct baseline series in scope with their method."""
    clause, params = where(con, f, time_col=c.TS_NS)
    return run(con, f"SELECT {c.SERIES}, {c.METRIC}, {c.SERVICE_NAME}, {c.MODEL}, {c.HOST_NAME},"
                    f" {c.METHOD}, count(*) AS points FROM ({baseline_rows(con)}) "
                    f"WHERE {clause} GROUP BY ALL ORDER BY 1, {c.METHOD}", params)


def baseline_with_actual(
    con: duckdb.DuckDBPyConnection, f: Filters, series: str, method: str
) -> pl.DataFrame:
    """One series' band joined with the observed window values; ``anomaly`` marks breaches."""
    clause, params = where(con, f, time_col=c.TS_NS, dims=())
    params.update({"series": series, "method": method})
    band = run(con, f"SELECT * FROM ({baseline_rows(con)}) WHERE {clause} "
                    f"AND {c.SERIES} = $series AND {c.METHOD} = $method ORDER BY {c.TS_NS}",
               params)
    if band.is_empty():
        return band
    first = band.row(0, named=True)
    metric = first[c.METRIC]
    scope = {"s": first[c.SERVICE_NAME], "m": first[c.MODEL], "h": first[c.HOST_NAME],
             "fleet": t.FLEET_WIDE}
    # The newest window may still be filling: its value is left out (its dip is no anomaly).
    newest = f"(SELECT max({c.WINDOW_START_NS}) FROM {t.WINDOWS})"
    if metric in table_columns(con, t.WINDOWS):
        actual = run(con, f"""SELECT {c.WINDOW_START_NS} AS {c.TS_NS}, avg("{metric}") AS actual
            FROM {t.WINDOWS} WHERE {c.SERVICE_NAME} = $s AND {c.MODEL} = $m
            AND {c.HOST_NAME} = $h AND {c.WINDOW_START_NS} < {newest}
            GROUP BY 1""", {k: v for k, v in scope.items() if k != "fleet"})
    elif c.VALUE in table_columns(con, t.BASELINES):
        # Series analytics builds itself (an instance against its peers, a host's slowest
        # GPU clock) are no `windows` column: their values are stored beside their bands.
        actual = run(con, f"""SELECT {c.TS_NS}, avg({c.VALUE}) AS actual FROM {t.BASELINES}
            WHERE {c.SERIES} = $series AND {c.METHOD} = $method AND {c.TS_NS} < {newest}
            GROUP BY 1""", {"series": series, "method": method})
    else:
        return band.with_columns(pl.lit(None, pl.Float64).alias("actual"),
                                 pl.lit(False).alias("anomaly"), pl.lit(False).alias("in_incident"))
    # Windows during an incident whose scope overlaps the series' (``*`` overlaps all).
    overlap = " AND ".join(f"({k} = ${p} OR {k} = $fleet OR ${p} = $fleet)" for k, p in
                           ((c.SERVICE_NAME, "s"), (c.MODEL, "m"), (c.HOST_NAME, "h")))
    spans = run(con, f"SELECT {c.START_NS}, {c.END_NS} FROM {t.INCIDENTS} WHERE {overlap}",
                scope)
    during = pl.lit(False)
    for start, end in spans.iter_rows():
        during = during | pl.col(c.TS_NS).is_between(start, end or start, closed="left")
    return band.join(actual, on=c.TS_NS, how="left").with_columns(
        ((pl.col("actual") > pl.col(c.UPPER)) | (pl.col("actual") < pl.col(c.LOWER)))
        .fill_null(False).alias("anomaly"), during.alias("in_incident"))
