"""Queries behind the incident detail page: context, phases, dimensions, signals, requests.

The incident's scope is its ``service_name``/``model``/``host_name`` (``*`` or empty means
all). The phase split, the dimension comparison and the baseline period are the rows
analytics stored (`incident_phases`, `incident_dimensions`, `incident_periods`); the charts
show the stretch around the incident (four times its length before, at least 30 minutes).
"""

from __future__ import annotations

import json
from typing import Any

import duckdb
import polars as pl

from fleetlens.analytics.attribution.phases import PHASES as PHASE_NAMES
from fleetlens.dashboard.filters import table_columns
from fleetlens.dashboard.queries import OVERVIEW_METHOD, baseline_rows, run
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

NS = 1_000_000_000
MIN_BASELINE_NS = 30 * 60 * NS
PHASES = (c.QUEUE_S, c.PREFILL_S, c.DECODE_S, c.OVERHEAD_S)


def incident(con: duckdb.DuckDBPyConnection, incident_id: str) -> dict[str, Any] | None:
    """One incident as a dict, or ``None``."""
    frame = run(con, f"SELECT * FROM {t.INCIDENTS} WHERE {c.INCIDENT_ID} = $id",
                {"id": incident_id})
    return frame.row(0, named=True) if frame.height else None


def periods(inc: dict[str, Any]) -> dict[str, int]:
    """Start/end of the incident, its baseline period and the context shown around it."""
    start, end = int(inc[c.START_NS]), int(inc[c.END_NS] or inc[c.START_NS])
    span = max(end - start, 60 * NS)
    base = max(4 * span, MIN_BASELINE_NS)
    return {"base_start": start - base, "start": start, "end": end,
            "ctx_start": start - base, "ctx_end": end + max(span, 10 * 60 * NS)}


def _scope(inc: dict[str, Any], *, with_host: bool = True) -> tuple[str, dict[str, Any]]:
    """Clause matching the incident's service/model/host (wildcards skipped)."""
    clauses, params = ["TRUE"], {}
    keys = (c.SERVICE_NAME, c.MODEL, c.HOST_NAME) if with_host else (c.SERVICE_NAME, c.MODEL)
    for key in keys:
        value = inc.get(key)
        if value and value != t.FLEET_WIDE:
            clauses.append(f"{key} = $s_{key}")
            params[f"s_{key}"] = value
    return " AND ".join(clauses), params


def metric_context(con: duckdb.DuckDBPyConnection, inc: dict[str, Any]) -> pl.DataFrame:
    """The incident metric per window around the incident, with its baseline band."""
    p = periods(inc)
    metric = inc[c.METRIC]
    host = inc.get(c.HOST_NAME) or t.FLEET_WIDE
    value = f'avg("{metric}")' if metric in _window_columns(con) else "NULL::DOUBLE"
    scope, params = _scope({**inc, c.HOST_NAME: host})
    params.update({"a": p["ctx_start"], "b": p["ctx_end"], "m": metric,
                   "method": OVERVIEW_METHOD})
    sql = f"""
        WITH v AS (SELECT {c.WINDOW_START_NS} AS {c.TS_NS}, {value} AS value FROM {t.WINDOWS}
                   WHERE {scope} AND {c.WINDOW_START_NS} BETWEEN $a AND $b GROUP BY 1),
             b AS (SELECT {c.TS_NS}, avg({c.EXPECTED}) AS {c.EXPECTED}, avg({c.LOWER}) AS
                   {c.LOWER}, avg({c.UPPER}) AS {c.UPPER} FROM ({baseline_rows(con)})
                   WHERE {scope} AND {c.METRIC} = $m AND {c.METHOD} = $method
                   AND {c.TS_NS} BETWEEN $a AND $b GROUP BY 1)
        SELECT * FROM v FULL JOIN b USING ({c.TS_NS}) ORDER BY {c.TS_NS}"""
    return run(con, sql, params)


def _window_columns(con: duckdb.DuckDBPyConnection) -> set[str]:
    return table_columns(con, t.WINDOWS)


def phase_breakdown(con: duckdb.DuckDBPyConnection, inc: dict[str, Any]) -> pl.DataFrame:
    """The incident's `incident_phases` rows as analytics stored them (the excess per phase
    its causes were ranked on, as ``fleetlens explain`` prints it), in phase order, with the
    excess in ms per request for the chart. Empty for an incident analytics did not split
    (a failure). Never recomputed here: a split of this page's own baseline slice once
    contradicted ``explain`` (issue 32)."""
    order = " ".join(f"WHEN '{p}' THEN {i}" for i, p in enumerate(PHASE_NAMES))
    return run(con, f"""SELECT {c.PHASE}, {c.EXCESS_S} * 1000 AS excess_ms, {c.SHARE}
        FROM {t.INCIDENT_PHASES} WHERE {c.INCIDENT_ID} = $id
        ORDER BY CASE {c.PHASE} {order} ELSE {len(PHASE_NAMES)} END""",
               {"id": inc[c.INCIDENT_ID]})


def dimension_compare(con: duckdb.DuckDBPyConnection, inc: dict[str, Any]) -> pl.DataFrame:
    """The incident's `incident_dimensions` rows: the dimension values analytics found
    over-represented among its slow requests, best first."""
    return run(con, f"""SELECT {c.DIMENSION}, {c.DIMENSION_VALUE}, {c.LIFT},
        {c.SHARE_OF_EXCESS} FROM {t.INCIDENT_DIMENSIONS} WHERE {c.INCIDENT_ID} = $id
        ORDER BY {c.RANK}""", {"id": inc[c.INCIDENT_ID]})


def compared_period(con: duckdb.DuckDBPyConnection, inc: dict[str, Any]
                    ) -> dict[str, Any] | None:
    """The incident's `incident_periods` row (the baseline period analytics compared
    against and the requests in each period), or ``None``."""
    frame = run(con, f"SELECT * FROM {t.INCIDENT_PERIODS} WHERE {c.INCIDENT_ID} = $id",
                {"id": inc[c.INCIDENT_ID]})
    return frame.row(0, named=True) if frame.height else None


def signals(con: duckdb.DuckDBPyConnection, inc: dict[str, Any]) -> pl.DataFrame:
    """Engine and GPU signals per window around the incident on its host(s)."""
    p = periods(inc)
    scope, params = _scope(inc)
    params.update({"a": p["ctx_start"], "b": p["ctx_end"], "fleet": t.FLEET_WIDE})
    host_scope, host_params = _scope({c.HOST_NAME: inc.get(c.HOST_NAME)})
    params.update(host_params)
    sql = f"""
        WITH w AS (SELECT {c.WINDOW_START_NS} AS {c.TS_NS}, sum({c.RPS}) AS arrivals_rps,
                          max({c.KV_CACHE_USAGE_MAX}) AS kv_usage_max,
                          sum({c.PREEMPTIONS}) AS preemptions,
                          avg({c.PREFIX_HIT_RATE}) AS prefix_hit_rate,
                          max(({c.WINDOW_S})::BIGINT) AS w_s
                   FROM {t.WINDOWS} WHERE {scope} AND {c.HOST_NAME} <> $fleet
                   AND {c.WINDOW_START_NS} BETWEEN $a AND $b GROUP BY 1),
             ws AS (SELECT coalesce(max(w_s), 60) AS w_s FROM w),
             g AS (SELECT ({c.TS_NS} // ((SELECT w_s FROM ws) * 1000000000))
                          * ((SELECT w_s FROM ws) * 1000000000) AS {c.TS_NS},
                          avg({c.SM_CLOCK_MHZ}) AS sm_clock_mhz,
                          bit_or({c.CLOCKS_EVENT_REASONS}) AS throttle_reasons,
                          avg({c.POWER_W}) AS power_w, avg({c.POWER_LIMIT_W}) AS power_limit_w,
                          max({c.TEMP_C}) AS temp_c_max
                   FROM {t.GPU_SAMPLES} WHERE {host_scope} AND {c.TS_NS} BETWEEN $a AND $b
                   GROUP BY 1)
        SELECT * EXCLUDE (w_s) FROM w FULL JOIN g USING ({c.TS_NS}) ORDER BY {c.TS_NS}"""
    return run(con, sql, params)


def slowest_requests(con: duckdb.DuckDBPyConnection, inc: dict[str, Any],
                     limit: int = 20) -> pl.DataFrame:
    """The slowest requests of the incident by its own metric (the longest TTFTs for a TTFT
    incident), with their phases."""
    p = periods(inc)
    scope, params = _scope(inc)
    params.update({"s": p["start"], "e": p["end"], "n": limit})
    # An identifier from the schema's own list, never from the data.
    order = c.request_latency_column(str(inc[c.METRIC])) or c.E2E_S
    names = [c.REQUEST_ID, c.TRACE_ID, c.HOST_NAME, c.ARRIVAL_NS, c.E2E_S, c.TTFT_S,
             *PHASES, c.INPUT_TOKENS, c.OUTPUT_TOKENS]
    cols = ", ".join(dict.fromkeys([*names, order]))
    return run(con, f"""SELECT {cols} FROM {t.REQUESTS} WHERE {scope}
        AND {c.ARRIVAL_NS} >= $s AND {c.ARRIVAL_NS} < $e
        ORDER BY {order} DESC NULLS LAST LIMIT $n""", params)


def report_markdown(inc: dict[str, Any], causes: pl.DataFrame, phases: pl.DataFrame) -> str:
    """A self-contained Markdown report of the incident for export."""
    lines = [f"# Incident {inc[c.INCIDENT_ID]}", "",
             f"- metric: {inc[c.METRIC]} (peak {inc[c.PEAK]:.4g}, expected {inc[c.EXPECTED]:.4g})",
             f"- scope: service={inc[c.SERVICE_NAME]} model={inc[c.MODEL]} "
             f"host={inc[c.HOST_NAME]}",
             f"- window: {inc[c.START_NS]} .. {inc[c.END_NS]} (ns, UTC)",
             f"- severity: {inc[c.SEVERITY]} (detector {inc[c.DETECTOR]})", "", "## Causes", ""]
    for row in causes.iter_rows(named=True):
        lines.append(f"{row[c.RANK]}. **{row[c.CAUSE]}** on {row[c.SUBJECT]} "
                     f"(score {row[c.SCORE]:.2f}, {100 * (row[c.SHARE_OF_EXCESS] or 0):.0f}% "
                     f"of excess): {row[c.SUMMARY]}")
        lines.append(f"   evidence: `{json.dumps(_evidence(row[c.EVIDENCE]))}`")
    lines += ["", "## Phase breakdown", "", "| phase | excess ms per request | share |",
              "|---|---|---|"]
    for row in phases.iter_rows(named=True):
        lines.append(f"| {row['phase']} | {row['excess_ms']:+.1f} | {row['share']:.0%} |")
    return "\n".join(lines) + "\n"


def _evidence(text: str | None) -> Any:
    try:
        return json.loads(text) if text else {}
    except json.JSONDecodeError:
        return text
