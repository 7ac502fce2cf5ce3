"""Small SQL helpers of the trace search: quoted identifiers, bound parameters, the columns
DuckDB reports for a view. User values only ever go through :class:`Params`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

if TYPE_CHECKING:
    import duckdb

#: Hive partition folders (``date=``, ``hour=``) that DuckDB's views show as columns.
PARTITION_COLUMNS = frozenset({c.DATE, c.HOUR})


def quote(name: str) -> str:
    """``name`` as a SQL identifier (names come from the schema or DuckDB, never the user)."""
    return '"' + name.replace('"', '""') + '"'


def describe(con: duckdb.DuckDBPyConnection, table: str) -> dict[str, str]:
    """Column name -> DuckDB type of a table or view (contract columns plus extras; not the
    folder names of its hive partitions, which are no data of a row)."""
    return {row[0]: row[1] for row in
            con.execute(f"DESCRIBE {quote(t.table(table).name)}").fetchall()
            if row[0] not in PARTITION_COLUMNS}


class Params:
    """Bound parameters of one query, named in order (``$p0``, ``$p1``, ...)."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def __call__(self, value: Any) -> str:  # noqa: ANN401 - any value DuckDB binds
        name = f"p{len(self.values)}"
        self.values[name] = value
        return f"${name}"
