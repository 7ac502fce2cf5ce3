"""The Leaderboard page's numbers, computed by :mod:`analytics.leaderboard` (one definition).

The page ranks the requests in the sidebar's range and scope, less the newest window (it may
still be filling) and the requests that arrived during an incident of their scope: a
leaderboard compares configurations in steady service. Percentiles, tokens/s per GPU,
J/token, the scores, the Pareto front and the bootstrap rank intervals are those of
``fleetlens leaderboard`` on the same requests; goodput per GPU and J/token at the knee are
the stored `capacity` rows of the pools in scope.
"""

from __future__ import annotations

import duckdb
import polars as pl

from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.leaderboard import leaderboard, outside_incidents, prepare
from fleetlens.dashboard.capacity_view import capacity_pools
from fleetlens.dashboard.filters import Filters, table_columns, where
from fleetlens.dashboard.queries import run
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.schema.settings import load_section

#: The ``requests`` columns ``prepare``/``leaderboard``/``outside_incidents`` read.
LEADERBOARD_COLUMNS = (
    c.REQUEST_ID, c.TRACE_ID, c.SPAN_ID, c.SERVICE_NAME, c.MODEL, c.HOST_NAME, c.INSTANCE_ID,
    c.GPU_MODEL, c.ARRIVAL_NS, c.END_NS, c.TTFT_S, c.TPOT_S, c.E2E_S, c.INPUT_TOKENS,
    c.OUTPUT_TOKENS, c.CACHED_TOKENS)


def analytics_config() -> AnalyticsConfig:
    """The ``[analytics]`` section the CLI uses ($FLEETLENS_CONFIG, FLEETLENS_ANALYTICS__*)."""
    return load_section(AnalyticsConfig, "analytics")


def newest_window_start(con: duckdb.DuckDBPyConnection) -> int | None:
    """Start (ns) of the newest window in the data: the one that may still be filling."""
    row = con.cursor().execute(f"SELECT max({c.WINDOW_START_NS}) FROM {t.WINDOWS}").fetchall()
    return int(row[0][0]) if row[0][0] is not None else None


def steady_requests(con: duckdb.DuckDBPyConnection, f: Filters) -> pl.DataFrame:
    """Requests in range and scope, less the newest window and incident periods."""
    clause, params = where(con, f, time_col=c.ARRIVAL_NS)
    newest = newest_window_start(con)
    if newest is not None:
        clause += f" AND {c.ARRIVAL_NS} < $newest"
        params["newest"] = newest
    # Only the columns the leaderboard reads: all of them cost 3x the transfer on a big day
    # (a test compares the result with analytics' on whole rows).
    present = table_columns(con, t.REQUESTS)
    cols = ", ".join(col for col in LEADERBOARD_COLUMNS if col in present)
    requests = run(con, f"SELECT {cols} FROM {t.REQUESTS} WHERE {clause}", params)
    inc_clause, inc_params = where(con, f, time_col=c.START_NS, end_col=c.END_NS, prefix="i_")
    incidents = run(con, f"SELECT * FROM {t.INCIDENTS} WHERE {inc_clause}", inc_params)
    return outside_incidents(requests, incidents)


def ranked(con: duckdb.DuckDBPyConnection, f: Filters) -> pl.DataFrame:
    """The leaderboard of the steady requests in scope, as ``analytics.leaderboard`` ranks
    them (one row per model, GPU model and config; best rank first)."""
    requests = steady_requests(con, f)
    if requests.is_empty():
        return pl.DataFrame()
    mapping = run(con, f"SELECT {c.INSTANCE_ID}, {c.GPU_UUID} FROM {t.INSTANCE_GPUS}", {})
    gpus = run(con, f"SELECT DISTINCT {c.HOST_NAME}, {c.GPU_MODEL} FROM {t.GPU_SAMPLES} "
                    f"ORDER BY 1, 2", {})
    clause, params = where(con, f, time_col=c.ARRIVAL_NS)
    # Only the energy of the requests in range: the table holds every retained request.
    energy = run(con, f"SELECT * FROM {t.REQUEST_ENERGY} WHERE {c.REQUEST_ID} IN "
                      f"(SELECT {c.REQUEST_ID} FROM {t.REQUESTS} WHERE {clause})", params)
    # goodput and J/token at the knee: the pools' stored `capacity` rows, as the CLI reads
    return leaderboard(prepare(requests, mapping, gpus, energy), analytics_config(),
                       capacity=capacity_pools(con, f))
