"""Terminal tables for the analytics commands (rich, plain when not a terminal).

Every cell goes through :func:`pipeline.terminal.cell`: service, host, model and cause
subjects come from telemetry and are never parsed as Rich markup nor passed raw control
characters to the terminal.
"""

from __future__ import annotations

import io

import polars as pl
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from fleetlens.analytics.failures.findings import DETECTOR_PREFIX
from fleetlens.analytics.report import iso
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.terminal import PIPED_WIDTH, cell, plain, table_width

NS = 1_000_000_000


def _row(table: Table, *values: object) -> None:
    table.add_row(*(cell(v) for v in values))


def _table() -> Table:
    """A table for narrow terminals: no vertical rules, long cells folded (never cut: a
    subject or a series is read whole), key columns kept on one line by :func:`_key_column`."""
    return Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)


def _column(table: Table, name: str, **kwargs: object) -> None:
    table.add_column(name, overflow="fold", **kwargs)  # type: ignore[arg-type]


#: Fewer columns than this per terminal column and a table is shown as one block per row:
#: squeezed further, Rich would cut every cell to a letter and a dot.
MIN_COLUMN_CHARS = 10


def _render(table: Table) -> str:
    # The terminal's width, so a table wraps its long cells instead of running past the
    # right edge of an 80-column terminal; whole lines into a pipe (table_width).
    buffer = io.StringIO()
    console = Console(file=buffer, width=table_width(), color_system=None)
    natural = console.measure(table, options=console.options.update_width(PIPED_WIDTH)).maximum
    if natural > console.width and len(table.columns) * MIN_COLUMN_CHARS > console.width:
        _print_blocks(console, table)
    else:
        console.print(table)
    return buffer.getvalue()


def _print_blocks(console: Console, table: Table) -> None:
    """Each row as its first cell, then ``header: value`` pairs wrapped to the width: every
    value whole, however many columns the table has."""
    headers = [str(column.header) for column in table.columns]
    columns = [[c.plain if isinstance(c, Text) else str(c) for c in column.cells]
               for column in table.columns]
    for values in zip(*columns, strict=True):
        pairs = [f"{h}: {v}" for h, v in zip(headers[1:], values[1:], strict=True) if v]
        console.print(f"{headers[0]} {values[0]}", markup=False, highlight=False)
        line = ""
        for pair in pairs:  # a line holds whole pairs: "config:" never ends one
            if line and len(line) + 2 + len(pair) > console.width - 2:
                console.print(f"  {line}", markup=False, highlight=False, overflow="fold")
                line = ""
            line = f"{line}  {pair}" if line else pair
        if line:
            console.print(f"  {line}", markup=False, highlight=False, overflow="fold")


def _key_column(table: Table, name: str) -> None:
    """A column whose cells are copied into the next command (ids, times): never wrapped."""
    table.add_column(name, no_wrap=True)


def incidents_table(frame: pl.DataFrame) -> str:
    """One row per incident: id, start, duration, scope, metric, peak/expected, top cause."""
    table = _table()
    _key_column(table, "id")
    # The rest wrap when the terminal is narrow, at their spaces first: the start's date
    # above its time, the metric above its rise, the top cause above its subject.
    for name in ("start (UTC)", "min", "severity", "metric", "scope", "top cause"):
        _column(table, name)
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
            f"{row[c.METRIC]} {shown}", scope or "fleet",
            f"{row.get(c.CAUSE) or '-'} {row.get(c.SUBJECT) or ''}".rstrip(),
        )
    return _render(table) + f"{frame.height} incidents\n"


def _outside(frame: pl.DataFrame) -> pl.Expr:
    """How far the latest value lies outside its band, in band widths (0 inside it or
    without a value): the order in which the series deserve a look."""
    width = pl.max_horizontal(pl.col(c.UPPER) - pl.col(c.LOWER), pl.lit(1e-12))
    beyond = pl.max_horizontal(pl.col(c.VALUE) - pl.col(c.UPPER),
                               pl.col(c.LOWER) - pl.col(c.VALUE), pl.lit(0.0))
    return (beyond / width).fill_null(0.0)


def baselines_table(frame: pl.DataFrame, show_all: bool = False) -> str:
    """Latest point per series and method with its band: the series out of their band first
    (farthest first), the others only with ``show_all`` (most of a calm fleet is in band,
    and a hundred calm rows would hide the two that are not)."""
    ranked = (frame.with_columns(_outside(frame).alias("_outside"))
              .sort(["_outside", c.SERIES, c.METHOD], descending=[True, False, False]))
    out = ranked.filter(pl.col("_outside") > 0)
    shown = ranked if show_all else out
    table = _table()
    _column(table, "series", min_width=16)
    for name in ("state", "value", "expected", "band", "method"):
        _column(table, name)
    # One time for all (the usual case) is said once, under the table, not on every row.
    times = shown[c.TS_NS].unique()
    if times.len() > 1:
        _key_column(table, "at (UTC)")
    for row in shown.iter_rows(named=True):
        value = row.get(c.VALUE)
        state = ("no value" if value is None else "in band" if row["_outside"] == 0
                 else "ABOVE" if value > row[c.UPPER] else "BELOW")
        _row(
            table,
            row[c.SERIES], state, "-" if value is None else f"{value:.4g}",
            f"{row[c.EXPECTED]:.4g}", f"{row[c.LOWER]:.4g} .. {row[c.UPPER]:.4g}",
            row[c.METHOD], *([iso(row[c.TS_NS])] if times.len() > 1 else []),
        )
    summary = f"{out.height} of {frame.height} series out of their band"
    if times.len() == 1:
        summary += f" at {iso(times[0])}"
    if not show_all and out.height < frame.height:
        summary += f"; --all lists the other {frame.height - out.height} too"
    return (_render(table) if shown.height else "") + summary + "\n"


def leaderboard_table(board: pl.DataFrame, best: dict | None, sla: dict[str, float]) -> str:
    """Ranked configurations with CIs, Pareto flag and the best under the SLA."""
    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    table = Table("rank (95% CI)", "model", "gpu", "config", "bucket", "ttft p99", "tpot p99",
                  "tok/s/GPU", "J/token", "HBM util", "goodput/GPU@knee", "J/token@knee",
                  "score", "entropy", "pareto")
    for row in board.iter_rows(named=True):
        _row(
            table,
            f"{row[c.RANK]} ({row[c.RANK_LO]}-{row[c.RANK_HI]})", row[c.MODEL],
            row[c.GPU_MODEL], row[c.CONFIG], row.get(c.PROMPT_BUCKET) or "all",
            num(row[c.percentile_column("ttft", "p99")], ".3f"),
            num(row[c.percentile_column("tpot", "p99")], ".4f"),
            num(row[c.TOK_S_PER_GPU], ".1f"), num(row[c.J_PER_TOKEN], ".3f"),
            num(row[c.MEM_BW_UTIL], ".0%"), num(row.get(c.GOODPUT_RPS_PER_GPU), ".2f"),
            num(row.get(c.J_PER_TOKEN_KNEE), ".3f"), num(row[c.WEIGHTED_SCORE], ".3f"),
            num(row[c.ENTROPY_SCORE], ".3f"), "yes" if row[c.PARETO] else "",
        )
    limits = ", ".join(f"{k} <= {v:g}" for k, v in sla.items())
    verdict = (f"best under SLA ({limits}): {best[c.MODEL]} on {best[c.GPU_MODEL]} "
               f"{best[c.CONFIG]} at {num(best[c.J_PER_TOKEN], '.3f')} J/token"
               if best else f"no configuration meets the SLA ({limits})")
    return _render(table) + plain(verdict) + "\n"
