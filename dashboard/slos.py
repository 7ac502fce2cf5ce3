"""Queries behind the availability page's SLO section: what the latest analytics run stored.

Analytics (``analytics/slos/``) writes, per configured SLO, its status over the compliance
period (`slo_status`), its burn rate over each alert window (`slo_burn_rates`), the firing
burn-rate alerts (`slo_alerts`) and its events per window (`slo_windows`). Nothing here
judges a request or evaluates a rule: the rows are read as stored, of the newest run only
(``ts_ns``, the end of its data), for the services in scope. SLOs are per service, so the
model and host filters do not apply; the time range only limits the budget chart.
"""

from __future__ import annotations

import duckdb
import polars as pl

from fleetlens.dashboard.filters import Filters, where
from fleetlens.dashboard.queries import run
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

#: Severities in the order a reader should see them.
SEVERITY_ORDER = ("page", "ticket")


def _latest(con: duckdb.DuckDBPyConnection, f: Filters, table: str, order: str
            ) -> pl.DataFrame:
    """Every column of ``table``'s rows of the newest run for the services in scope."""
    clause, params = where(con, f, time_col=None, dims=(c.SERVICE_NAME,))
    return run(con, f"""
        SELECT * FROM {table}
        WHERE {clause} AND {c.TS_NS} = (SELECT max({c.TS_NS}) FROM {table})
        ORDER BY {order}""", params)


def slo_status(con: duckdb.DuckDBPyConnection, f: Filters) -> pl.DataFrame:
    """One `slo_status` row per (service, SLO): objective, compliance and error budget."""
    return _latest(con, f, t.SLO_STATUS, f"{c.SERVICE_NAME}, {c.SLO_KIND}, {c.SLO}")


def slo_burn_rates(con: duckdb.DuckDBPyConnection, f: Filters) -> pl.DataFrame:
    """The `slo_burn_rates` rows: per (service, SLO) and alert window, the burn rate."""
    return _latest(con, f, t.SLO_BURN_RATES, f"{c.SERVICE_NAME}, {c.SLO}, {c.WINDOW_S}")


def slo_alerts(con: duckdb.DuckDBPyConnection, f: Filters) -> pl.DataFrame:
    """The burn-rate alerts firing at the newest run, pages first, oldest first."""
    rows = _latest(con, f, t.SLO_ALERTS, f"{c.SERVICE_NAME}, {c.SINCE_NS}, {c.ALERT}")
    rank = {s: i for i, s in enumerate(SEVERITY_ORDER)}
    return rows.sort(pl.col(c.SERVICE_NAME),
                     pl.col(c.SEVERITY).replace_strict(rank, default=len(rank),
                                                       return_dtype=pl.Int64),
                     pl.col(c.SINCE_NS))


def slo_budget_series(con: duckdb.DuckDBPyConnection, f: Filters) -> pl.DataFrame:
    """Per (service, SLO) and window of the compliance period: the share of the period's
    error budget spent by the end of that window (``ts_ns, service_name, slo,
    budget_consumed``).

    The bad events of `slo_windows` summed from the period's start, over the allowed bad
    events `slo_status` stored for the whole period: the last point is the stored
    ``budget_consumed`` (above 1 when overspent). Rows outside the time range are left out
    after summing, so a point is always counted from the period's start.
    """
    clause, params = where(con, f, time_col=None, dims=(c.SERVICE_NAME,), prefix="s_")
    rng, rng_params = where(con, f, time_col=c.TS_NS, dims=(), prefix="r_")
    params.update(rng_params)
    key = f"{c.SERVICE_NAME}, {c.SLO}"
    return run(con, f"""
        WITH s AS (SELECT {key}, {c.TS_NS} AS now_ns, {c.PERIOD_S}, {c.ALLOWED_BAD_EVENTS}
                   FROM {t.SLO_STATUS} WHERE {clause}
                   AND {c.TS_NS} = (SELECT max({c.TS_NS}) FROM {t.SLO_STATUS})),
             w AS (SELECT {key}, {c.WINDOW_START_NS} + {c.WINDOW_S} * 1000000000
                          AS {c.TS_NS},
                          sum({c.BAD_EVENTS}) OVER (PARTITION BY {key}
                                                    ORDER BY {c.WINDOW_START_NS})
                          / nullif({c.ALLOWED_BAD_EVENTS}, 0) AS {c.BUDGET_CONSUMED}
                   FROM {t.SLO_WINDOWS} JOIN s USING ({c.SERVICE_NAME}, {c.SLO})
                   WHERE {c.WINDOW_START_NS} >= now_ns - {c.PERIOD_S} * 1000000000
                   AND {c.WINDOW_START_NS} < now_ns)
        SELECT {c.TS_NS}, {c.SERVICE_NAME}, {c.SLO}, {c.BUDGET_CONSUMED} FROM w
        WHERE {rng} ORDER BY {key}, {c.TS_NS}""", params)
