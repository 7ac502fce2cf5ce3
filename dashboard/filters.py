"""The dashboard's filters and the one place they become SQL.

Every value a user picks or types reaches DuckDB as a bound parameter (``$name``); column
names come only from :mod:`pipeline.schema.columns`. Nothing the user enters is ever
formatted into a SQL string.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import duckdb

from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t


@dataclass(frozen=True)
class Filters:
    """Time range (ns, half-open) and dimension filters; an empty tuple means "all"."""

    start_ns: int | None = None
    end_ns: int | None = None
    services: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    hosts: tuple[str, ...] = ()
    regions: tuple[str, ...] = ()

    @property
    def by_host(self) -> bool:
        """Whether host-level rows are needed (a host or region filter is set)."""
        return bool(self.hosts or self.regions)

    def with_range(self, start_ns: int | None, end_ns: int | None) -> Filters:
        return replace(self, start_ns=start_ns, end_ns=end_ns)


def table_columns(con: duckdb.DuckDBPyConnection, table: str) -> set[str]:
    """Column names of a table or view as DuckDB sees it (contract columns plus extras)."""
    return {row[0] for row in con.execute(f'DESCRIBE "{t.table(table).name}"').fetchall()}


def region_hosts(con: duckdb.DuckDBPyConnection, regions: tuple[str, ...]) -> list[str]:
    """Hosts whose requests carry one of ``regions`` (empty when requests have no region)."""
    if not regions or c.REGION not in table_columns(con, t.REQUESTS):
        return []
    rows = con.execute(
        f"SELECT DISTINCT {c.HOST_NAME} FROM {t.REQUESTS} "
        f"WHERE list_contains($regions::VARCHAR[], {c.REGION})",
        {"regions": list(regions)},
    ).fetchall()
    return sorted(r[0] for r in rows)


def where(
    con: duckdb.DuckDBPyConnection,
    f: Filters,
    *,
    time_col: str | None,
    end_col: str | None = None,
    dims: tuple[str, ...] = (c.SERVICE_NAME, c.MODEL, c.HOST_NAME),
    prefix: str = "p_",
) -> tuple[str, dict[str, Any]]:
    """A ``WHERE`` clause (without the keyword) and its bound parameters.

    Args:
        con: used to resolve regions to hosts.
        f: the filters.
        time_col: the event-time column compared with the range (``None``: no time filter).
        end_col: when given, rows overlapping the range match (``end_col >= start`` and
            ``time_col < end``), for things with a duration such as incidents.
        dims: the dimension columns this table has (others are not filtered).
        prefix: parameter name prefix, distinct per clause when a query has several.
    """
    clauses = ["TRUE"]
    params: dict[str, Any] = {}
    if time_col and f.start_ns is not None:
        clauses.append(f"{end_col or time_col} >= ${prefix}start")
        params[f"{prefix}start"] = f.start_ns
    if time_col and f.end_ns is not None:
        clauses.append(f"{time_col} < ${prefix}end")
        params[f"{prefix}end"] = f.end_ns
    wanted = {c.SERVICE_NAME: f.services, c.MODEL: f.models}
    if f.by_host:
        hosts = set(f.hosts) if f.hosts else None
        if f.regions:
            in_region = set(region_hosts(con, f.regions))
            hosts = in_region if hosts is None else hosts & in_region
        if not hosts and c.HOST_NAME in dims:
            clauses.append("FALSE")  # no host is in the selection (e.g. an empty region)
        wanted[c.HOST_NAME] = tuple(sorted(hosts or ()))
    for column, values in wanted.items():
        if values and column in dims:
            name = f"{prefix}{column}"
            clauses.append(f"list_contains(${name}::VARCHAR[], {column})")
            params[name] = list(values)
    return " AND ".join(clauses), params
