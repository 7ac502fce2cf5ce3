"""The SQL console: one read-only statement over the data directory, results capped.

Defences, each on its own enough to stop the common abuse:

- a fresh sandboxed DuckDB per query (:func:`pipeline.storage.connect` with
  ``read_only_sandbox=True``: external access off, configuration locked), so no file outside
  the views can be read or written and nothing one user does is seen by the next;
- exactly one statement, and it must be a ``SELECT`` (which includes ``WITH`` and
  ``VALUES``): no ``ATTACH``, ``COPY``, ``INSTALL``, ``SET`` or DDL;
- at most ``row_cap`` rows come back, and a timer interrupts queries that run too long.

The sidebar filters are offered as bound parameters (``$from_ns``, ``$to_ns``,
``$services``, ``$models``, ``$hosts``): a query uses them by name and their values never
become SQL text.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import Any

import duckdb
import polars as pl

from fleetlens.dashboard.filters import Filters
from fleetlens.pipeline.storage import DataDir, connect, retry_vanished, tables_named_in

_PARAM = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")


class SqlRejected(ValueError):
    """The statement is not a single read-only query, or it failed; the message says why."""


@dataclass(frozen=True)
class SqlResult:
    """Rows of a console query; ``truncated`` when more than ``row_cap`` rows matched."""

    frame: pl.DataFrame
    truncated: bool


def filter_params(f: Filters) -> dict[str, Any]:
    """The sidebar filters as named parameters a console query may use."""
    return {
        "from_ns": f.start_ns, "to_ns": f.end_ns, "services": list(f.services),
        "models": list(f.models), "hosts": list(f.hosts), "regions": list(f.regions),
    }


def run_query(
    root: DataDir,
    query: str,
    *,
    row_cap: int,
    params: dict[str, Any] | None = None,
    timeout_s: float = 30.0,
) -> SqlResult:
    """Run one read-only ``query``; only the parameters it names are bound.

    Raises:
        SqlRejected: for anything but one ``SELECT``, for unknown parameters, on SQL errors
            and on timeout.
    """
    if not query.strip():
        raise SqlRejected("enter a query")
    con = connect(root, read_only_sandbox=True, tables=tables_named_in(query) or None)
    timer = threading.Timer(timeout_s, con.interrupt)
    try:
        try:
            statements = con.extract_statements(query)
        except duckdb.Error as exc:
            raise SqlRejected(f"syntax error: {exc}") from None
        if len(statements) != 1:
            raise SqlRejected(f"expected exactly one statement, got {len(statements)}")
        if statements[0].type != duckdb.StatementType.SELECT:
            raise SqlRejected(f"only SELECT queries are allowed (got {statements[0].type.name})")
        available = params or {}
        wanted = dict.fromkeys(_PARAM.findall(query))
        unknown = [name for name in wanted if name not in available]
        if unknown:
            raise SqlRejected(f"unknown parameter(s) {', '.join('$' + n for n in unknown)}; "
                              f"available: {', '.join('$' + n for n in available) or 'none'}")
        bound = {name: available[name] for name in wanted}
        timer.start()
        try:
            frame = retry_vanished(  # compaction may delete a file the query listed
                lambda: con.sql(query, params=bound or None).limit(row_cap + 1).pl())
        except duckdb.InterruptException:
            raise SqlRejected(f"query stopped after {timeout_s:.0f} s") from None
        except duckdb.Error as exc:
            raise SqlRejected(f"query failed: {exc}") from None
    finally:
        timer.cancel()
        con.close()
    return SqlResult(frame.head(row_cap), frame.height > row_cap)
