"""Terminal tables for the analytics commands (rich, plain when not a terminal)."""

from __future__ import annotations

import io

import polars as pl
from rich.console import Console
from rich.table import Table

from analytics.report import iso
from pipeline.schema import columns as c

NS = 1_000_000_000


def _render(table: Table) -> str:
    buffer = io.StringIO()
    Console(file=buffer, width=200, color_system=None).print(table)
    return buffer.getvalue()


def incidents_table(frame: pl.DataFrame) -> str:
    """One row per incident: id, start, duration, scope, metric, peak/expected, top cause."""
    table = Table("id", "start (UTC)", "min", "severity", "scope", "metric", "peak/expected",
                  "top cause", "subject")
    for row in frame.iter_rows(named=True):
        scope = "/".join(v for v in (row[c.SERVICE_NAME], row[c.HOST_NAME]) if v != "*")
        ratio = row[c.PEAK] / row[c.EXPECTED] if row[c.EXPECTED] else float("nan")
        table.add_row(
            row[c.INCIDENT_ID], iso(row[c.START_NS]),
            f"{(row[c.END_NS] - row[c.START_NS]) / NS / 60:.0f}", row[c.SEVERITY],
            scope or "fleet", row[c.METRIC], f"x{ratio:.2f}", row.get(c.CAUSE) or "-",
            row.get(c.SUBJECT) or "-",
        )
    return _render(table) + f"{frame.height} incidents\n"


def baselines_table(frame: pl.DataFrame) -> str:
    """Latest point per series and method with its band."""
    table = Table("series", "method", "at (UTC)", "value", "expected", "band")
    for row in frame.iter_rows(named=True):
        value = row.get(c.VALUE)
        table.add_row(
            row[c.SERIES], row[c.METHOD], iso(row[c.TS_NS]),
            "-" if value is None else f"{value:.4g}", f"{row[c.EXPECTED]:.4g}",
            f"{row[c.LOWER]:.4g} .. {row[c.UPPER]:.4g}",
        )
    return _render(table) + f"{frame.height} series\n"
