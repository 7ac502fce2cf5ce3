"""Terminal tables for the analytics commands (rich, plain when not a terminal).

Every cell goes through :func:`pipeline.terminal.cell`: service, host, model and cause
subjects come from telemetry and are never parsed as Rich markup nor passed raw control
characters to the terminal.
"""

from __future__ import annotations

import io

import polars as pl
from rich.console import Console
from rich.table import Table

from fleetlens.analytics.failures.findings import DETECTOR_PREFIX
from fleetlens.analytics.report import iso
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.terminal import cell, plain

NS = 1_000_000_000


def _row(table: Table, *values: object) -> None:
    table.add_row(*(cell(v) for v in values))


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
        # a failure has no band: its peak is a count or a duration, not a rise
        shown = ("-" if str(row[c.DETECTOR]).startswith(DETECTOR_PREFIX)
                 else f"x{ratio:.2f}")
        _row(
            table,
            row[c.INCIDENT_ID], iso(row[c.START_NS]),
            f"{(row[c.END_NS] - row[c.START_NS]) / NS / 60:.0f}", row[c.SEVERITY],
            scope or "fleet", row[c.METRIC], shown, row.get(c.CAUSE) or "-",
            row.get(c.SUBJECT) or "-",
        )
    return _render(table) + f"{frame.height} incidents\n"


def baselines_table(frame: pl.DataFrame) -> str:
    """Latest point per series and method with its band."""
    table = Table("series", "method", "at (UTC)", "value", "expected", "band")
    for row in frame.iter_rows(named=True):
        value = row.get(c.VALUE)
        _row(
            table,
            row[c.SERIES], row[c.METHOD], iso(row[c.TS_NS]),
            "-" if value is None else f"{value:.4g}", f"{row[c.EXPECTED]:.4g}",
            f"{row[c.LOWER]:.4g} .. {row[c.UPPER]:.4g}",
        )
    return _render(table) + f"{frame.height} series\n"


def leaderboard_table(board: pl.DataFrame, best: dict | None, sla: dict[str, float]) -> str:
    """Ranked configurations with CIs, Pareto flag and the best under the SLA."""
    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    table = Table("rank (95% CI)", "model", "gpu", "config", "bucket", "ttft p99", "tpot p99",
                  "tok/s/GPU", "J/token", "HBM util", "score", "entropy", "pareto")
    for row in board.iter_rows(named=True):
        _row(
            table,
            f"{row[c.RANK]} ({row[c.RANK_LO]}-{row[c.RANK_HI]})", row[c.MODEL],
            row[c.GPU_MODEL], row[c.CONFIG], row.get(c.PROMPT_BUCKET) or "all",
            num(row[c.percentile_column("ttft", "p99")], ".3f"),
            num(row[c.percentile_column("tpot", "p99")], ".4f"),
            num(row[c.TOK_S_PER_GPU], ".1f"), num(row[c.J_PER_TOKEN], ".3f"),
            num(row[c.MEM_BW_UTIL], ".0%"), num(row[c.WEIGHTED_SCORE], ".3f"),
            num(row[c.ENTROPY_SCORE], ".3f"), "yes" if row[c.PARETO] else "",
        )
    limits = ", ".join(f"{k} <= {v:g}" for k, v in sla.items())
    verdict = (f"best under SLA ({limits}): {best[c.MODEL]} on {best[c.GPU_MODEL]} "
               f"{best[c.CONFIG]} at {num(best[c.J_PER_TOKEN], '.3f')} J/token"
               if best else f"no configuration meets the SLA ({limits})")
    return _render(table) + plain(verdict) + "\n"
