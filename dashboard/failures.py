"""Queries behind the availability page, the change markers and failure incident pages.

They read what the agent sent and what analytics stored: each engine's scrapes
(``engine_samples.up``, ``process_start_time_s``), the failure incidents analytics wrote
(detector ``failure:<cause>``, one cause row each) and the latency incidents that name one
of them as their rank-1 cause (evidence ``failure_incident_id``). Nothing here detects a
failure: an up/down timeline is the scrapes drawn as they are.
"""

from __future__ import annotations

from typing import Any

import duckdb
import polars as pl

from fleetlens.analytics.failures.findings import DETECTOR_PREFIX, FINDING_CAUSES
from fleetlens.dashboard.filters import Filters, table_columns, where
from fleetlens.dashboard.queries import run
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

NS = 1_000_000_000
#: How analytics names its failure detectors in `incidents` (``failure:<cause>``): the
#: failures and the hardware warnings (a GPU throttling by heat), which have no latency
#: analysis either.
FAILURE_DETECTOR_PREFIX = DETECTOR_PREFIX
FAILURE_DETECTORS = sorted(FAILURE_DETECTOR_PREFIX + cause for cause in FINDING_CAUSES)
#: The key of a cause row's evidence that names the failure incident it stands for.
FAILURE_KEY = "failure_incident_id"
#: A gap between two scrapes of an engine longer than this many usual gaps (and at least
#: MIN_SILENCE_NS) is drawn as "no data": the agent, or the host, said nothing.
SILENCE_GAPS = 3
MIN_SILENCE_NS = 30 * NS
#: The states of the timeline, in legend order.
UP, DOWN, SILENT = "up", "down", "no data"


def is_failure(inc: dict[str, Any]) -> bool:
    """Whether an incident is a failure analytics found (not a latency incident)."""
    return str(inc.get(c.DETECTOR) or "") in FAILURE_DETECTORS


def failure_incidents(con: duckdb.DuckDBPyConnection, f: Filters) -> pl.DataFrame:
    """Failure incidents overlapping the range in scope, oldest first, with their cause row.

    Host-level failures have no model and service-level ones no host, so only the service
    and host filters apply (a model filter would hide a host that went down)."""
    clause, params = where(con, f, time_col=c.START_NS, end_col=c.END_NS,
                           dims=(c.SERVICE_NAME, c.HOST_NAME))
    params["detectors"] = FAILURE_DETECTORS
    sql = f"""
        SELECT i.{c.INCIDENT_ID}, i.{c.START_NS}, i.{c.END_NS}, i.{c.SEVERITY}, i.{c.DETECTOR},
               i.{c.SERVICE_NAME}, i.{c.HOST_NAME}, k.{c.CAUSE}, k.{c.SUBJECT}, k.{c.SUMMARY},
               k.{c.EVIDENCE}
        FROM (SELECT * FROM {t.INCIDENTS} WHERE {clause}
              AND list_contains($detectors::VARCHAR[], {c.DETECTOR})) i
        LEFT JOIN (SELECT * FROM {t.CAUSES} WHERE {c.RANK} = 1) k USING ({c.INCIDENT_ID})
        ORDER BY i.{c.START_NS}, i.{c.INCIDENT_ID}"""
    return run(con, sql, params)


def failure_effects(con: duckdb.DuckDBPyConnection, incident_id: str) -> pl.DataFrame:
    """The incidents that name failure ``incident_id`` as their rank-1 cause (its peers'
    latency incidents), with the cause ranked after it: what the failure set off."""
    sql = f"""
        WITH named AS (SELECT {c.INCIDENT_ID} FROM {t.CAUSES}
                       WHERE {c.RANK} = 1 AND {c.INCIDENT_ID} <> $id
                       AND json_extract_string({c.EVIDENCE}, '$.{FAILURE_KEY}') = $id)
        SELECT i.{c.INCIDENT_ID}, i.{c.START_NS}, i.{c.END_NS}, i.{c.METRIC},
               i.{c.SERVICE_NAME}, i.{c.MODEL}, i.{c.HOST_NAME}, i.{c.PEAK}, i.{c.EXPECTED},
               i.{c.SEVERITY}, nxt.{c.CAUSE}, nxt.{c.SUMMARY}
        FROM {t.INCIDENTS} i JOIN named USING ({c.INCIDENT_ID})
        LEFT JOIN (SELECT * FROM {t.CAUSES} WHERE {c.RANK} = 2) nxt USING ({c.INCIDENT_ID})
        ORDER BY i.{c.START_NS}"""
    return run(con, sql, {"id": incident_id})


def _engine_clause(con: duckdb.DuckDBPyConnection, f: Filters) -> tuple[str, dict[str, Any]]:
    """Engine samples in range and scope; ``engine_samples`` has no service, so a service
    filter keeps the hosts that served it (from ``windows``)."""
    clause, params = where(con, f, time_col=c.TS_NS, dims=(c.MODEL, c.HOST_NAME))
    if f.services:
        params["svc"] = list(f.services)
        clause += (f" AND {c.HOST_NAME} IN (SELECT DISTINCT {c.HOST_NAME} FROM {t.WINDOWS}"
                   f" WHERE list_contains($svc::VARCHAR[], {c.SERVICE_NAME}))")
    return clause, params


def engine_timeline(con: duckdb.DuckDBPyConnection, f: Filters) -> pl.DataFrame:
    """Per engine, runs of ``up`` / ``down`` / ``no data``: ``instance_id, host_name,
    service_name, state, start_ns, end_ns``.

    Each scrape holds its state until the next one; a gap of more than
    :data:`SILENCE_GAPS` usual gaps (at least :data:`MIN_SILENCE_NS`) is "no data", up to
    the newest scrape of any engine when the engine never came back. Samples without ``up``
    (an older agent) count as up: a scrape arrived.
    """
    clause, params = _engine_clause(con, f)
    up = f"coalesce({c.UP}, 1)" if c.UP in table_columns(con, t.ENGINE_SAMPLES) else "1"
    params.update({"min_silence": MIN_SILENCE_NS, "gaps": SILENCE_GAPS,
                   "up": UP, "down": DOWN, "silent": SILENT})
    inst, ts = c.INSTANCE_ID, c.TS_NS
    sql = f"""
        WITH s AS (SELECT {inst}, any_value({c.HOST_NAME}) AS {c.HOST_NAME}, {ts},
                          min({up}) AS up FROM {t.ENGINE_SAMPLES} WHERE {clause} GROUP BY ALL),
             n AS (SELECT *, lead({ts}) OVER (PARTITION BY {inst} ORDER BY {ts}) AS nxt FROM s),
             st AS (SELECT {inst}, coalesce(median(nxt - {ts}), 10000000000)::BIGINT AS step
                    FROM n GROUP BY 1),
             e AS (SELECT n.*, st.step, coalesce(nxt, (SELECT max({ts}) FROM s)) AS until,
                          greatest(st.step * $gaps, $min_silence) AS silence
                   FROM n JOIN st USING ({inst})),
             iv AS (SELECT {inst}, {c.HOST_NAME}, {ts} AS s0,
                           CASE WHEN until - {ts} > silence OR until = {ts} THEN {ts} + step
                                ELSE until END AS s1,
                           CASE WHEN up > 0 THEN $up ELSE $down END AS state FROM e
                    UNION ALL
                    SELECT {inst}, {c.HOST_NAME}, {ts} + step, until, $silent FROM e
                    WHERE until - {ts} > silence),
             r AS (SELECT *, CASE WHEN state = lag(state) OVER w AND s0 <= lag(s1) OVER w
                                  THEN 0 ELSE 1 END AS new_run
                   FROM iv WINDOW w AS (PARTITION BY {inst} ORDER BY s0)),
             g AS (SELECT *, sum(new_run) OVER (PARTITION BY {inst} ORDER BY s0) AS run_id
                   FROM r)
        SELECT {inst}, any_value({c.HOST_NAME}) AS {c.HOST_NAME}, any_value(state) AS state,
               min(s0) AS {c.START_NS}, max(s1) AS {c.END_NS}
        FROM g GROUP BY {inst}, run_id ORDER BY {inst}, {c.START_NS}"""
    segments = run(con, sql, params)
    return segments.join(engine_services(con, f), on=c.INSTANCE_ID, how="left").with_columns(
        pl.col(c.SERVICE_NAME).fill_null("(no requests in range)"))


def engine_services(con: duckdb.DuckDBPyConnection, f: Filters) -> pl.DataFrame:
    """The service each engine served most in range (failed gateway requests count: they
    name the engine they were routed to)."""
    clause, params = where(con, f, time_col=c.ARRIVAL_NS, dims=(c.MODEL, c.HOST_NAME))
    return run(con, f"""
        SELECT {c.INSTANCE_ID}, arg_max({c.SERVICE_NAME}, n) AS {c.SERVICE_NAME}
        FROM (SELECT {c.INSTANCE_ID}, {c.SERVICE_NAME}, count(*) AS n FROM {t.REQUESTS}
              WHERE {clause} AND {c.INSTANCE_ID} IS NOT NULL GROUP BY 1, 2)
        GROUP BY 1""", params)


def engine_restarts(con: duckdb.DuckDBPyConnection, f: Filters) -> pl.DataFrame:
    """Scrapes whose process start time differs from the engine's previous one by a second
    or more: ``instance_id, host_name, ts_ns, start_ns`` (the new process' start, never
    after the scrape that saw it). Empty when the agent sends no start time."""
    if c.PROCESS_START_TIME_S not in table_columns(con, t.ENGINE_SAMPLES):
        return pl.DataFrame(schema={c.INSTANCE_ID: pl.String, c.HOST_NAME: pl.String,
                                    c.TS_NS: pl.Int64, c.START_NS: pl.Int64})
    clause, params = _engine_clause(con, f)
    began = f"{c.PROCESS_START_TIME_S}"
    return run(con, f"""
        SELECT {c.INSTANCE_ID}, {c.HOST_NAME}, {c.TS_NS},
               least(({began} * 1e9)::BIGINT, {c.TS_NS}) AS {c.START_NS}
        FROM (SELECT *, lag({began}) OVER (PARTITION BY {c.INSTANCE_ID} ORDER BY {c.TS_NS})
                        AS before
              FROM {t.ENGINE_SAMPLES} WHERE {clause} AND {began} IS NOT NULL)
        WHERE abs({began} - before) >= 1 ORDER BY {c.TS_NS}""", params)
