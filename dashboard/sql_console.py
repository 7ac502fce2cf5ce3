"""The SQL console: one read-only statement over the data directory, results capped.

The query runs in :mod:`pipeline.sandbox`, the same sandbox as ``fleetlens sql``: a fresh
DuckDB per query with external access off and the configuration locked, exactly one
``SELECT`` (no ``ATTACH``, ``COPY``, ``INSTALL``, ``SET`` or DDL), bounded memory, threads
and temp space (one query once reached 5 GB RSS in the dashboard process), at most
``row_cap`` rows *and* at most ``limits.result_mb`` bytes back, and a timer that interrupts
queries that run too long.

The sidebar filters are offered as bound parameters (``$from_ns``, ``$to_ns``,
``$services``, ``$models``, ``$hosts``): a query uses them by name and their values never
become SQL text.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

import polars as pl

from fleetlens.dashboard.filters import Filters
from fleetlens.pipeline.sandbox import QueryRejected, SandboxLimits, fetch, sandbox
from fleetlens.pipeline.storage import DataDir

_PARAM = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")


#: The statement is not a single read-only query, broke a limit, or failed (the message
#: says which); the sandbox's error under the console's historical name.
SqlRejected = QueryRejected
#: The dashboard's share of a 2-core machine: one query may not starve the pages.
CONSOLE_LIMITS = SandboxLimits(memory_mb=512, threads=1, temp_mb=1024, result_mb=64,
                               timeout_s=30.0)


@dataclass(frozen=True)
class SqlResult:
    """Rows of a console query; ``truncated`` when a cap cut it, ``cut`` says which one
    (``"rows"``: more than ``row_cap`` rows matched; ``"bytes"``: the result passed
    ``result_mb``)."""

    frame: pl.DataFrame
    truncated: bool
    cut: str | None = None


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
    timeout_s: float | None = None,
    limits: SandboxLimits = CONSOLE_LIMITS,
) -> SqlResult:
    """Run one read-only ``query``; only the parameters it names are bound.

    Args:
        root: the data directory.
        query: one SELECT.
        row_cap: most rows returned.
        params: parameters the query may name (:func:`filter_params`).
        timeout_s: overrides ``limits.timeout_s``.
        limits: memory, threads, temp space, result bytes and timeout.

    Raises:
        SqlRejected: for anything but one ``SELECT``, for unknown parameters, on SQL errors,
            on the memory and temp limits and on timeout.
    """
    if timeout_s is not None:
        limits = dataclasses.replace(limits, timeout_s=timeout_s)
    with sandbox(root, query, limits) as con:
        available = params or {}
        wanted = dict.fromkeys(_PARAM.findall(query))
        unknown = [name for name in wanted if name not in available]
        if unknown:
            raise SqlRejected(f"unknown parameter(s) {', '.join('$' + n for n in unknown)}; "
                              f"available: {', '.join('$' + n for n in available) or 'none'}")
        bound = {name: available[name] for name in wanted}
        got = fetch(con, query, limits, row_cap=row_cap, params=bound)
    return SqlResult(pl.from_arrow(got.table), got.cut is not None, got.cut)
