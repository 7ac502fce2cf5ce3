"""``fleetlens traces diff A [B]``: two requests side by side, or one against the median
request of its service and model around its arrival. The comparison runs in
:mod:`analytics.traces.side_by_side`; this module parses flags and prints."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from fleetlens.analytics.cli import _CONFIG, _DATA_DIR, _root
from fleetlens.analytics.traces.query import SearchError
from fleetlens.pipeline.output import format_option, render_rows
from fleetlens.pipeline.schema import columns as c

if TYPE_CHECKING:
    import polars as pl

NS = 1_000_000_000


def _cell(name: str, value: float | None) -> str:
    if value is None:
        return "-"
    if name.endswith("_s"):
        return f"{value * 1e3:,.1f} ms"
    if name == c.KV_CACHE_USAGE:
        return f"{value:.0%}"
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"


def diff_table(frame: pl.DataFrame, left: str, right: str) -> str:
    """The side-by-side rows for a terminal: latencies in ms, KV usage in percent."""
    from fleetlens.analytics.cli_table import _column, _key_column, _render, _row, _table

    table = _table()
    _key_column(table, "field")
    for name in (left, right, "difference", "ratio"):
        _column(table, name, justify="right")
    for row in frame.iter_rows(named=True):
        ratio = "-" if row["ratio"] is None else f"x{row['ratio']:.2f}"
        _row(table, row["field"], _cell(row["field"], row["a"]), _cell(row["field"], row["b"]),
             _cell(row["field"], row["difference"]), ratio)
    return _render(table)


def _label(row: dict[str, Any]) -> str:
    return f"{row[c.REQUEST_ID]} ({row[c.HOST_NAME]} {row[c.INSTANCE_ID]})"


@click.command("diff")
@click.argument("first", metavar="A")
@click.argument("second", metavar="[B]", required=False)
@_DATA_DIR
@_CONFIG
@click.option("--window", type=click.IntRange(10, 86400), default=300, show_default=True,
              metavar="SECONDS", help="Without B: the median of the requests of A's service "
                                      "and model arriving within this window around A.")
@format_option()
@click.pass_context
def diff_command(ctx: click.Context, first: str, second: str | None, data_dir: str | None,
                 config_file: str | None, window: int, fmt: str) -> None:
    """Request A next to request B (request or trace ids), or next to the median request of
    its service and model around its arrival: phases, TTFT/TPOT, tokens, cached tokens, and
    the engine's queue depth (num_waiting), batch (num_running) and KV usage when it
    arrived."""
    from fleetlens.analytics.traces.side_by_side import median_row, request_row, side_by_side
    from fleetlens.pipeline.schema import tables as t
    from fleetlens.pipeline.storage import connect

    parent = ctx.obj or {}
    root = _root(data_dir or parent.get("data_dir"), config_file or parent.get("config_file"))
    con = connect(root, tables=(t.REQUESTS, t.ENGINE_SAMPLES))
    try:
        a = request_row(con, first)
        b = request_row(con, second) if second else median_row(con, a, window * NS)
    except SearchError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        con.close()
    frame = side_by_side(a, b)
    right = (_label(b) if second else
             f"median of {b['requests']:,} {a[c.SERVICE_NAME]} requests within {window} s")
    if fmt != "table":
        click.echo(render_rows(frame, fmt), nl=False)
        click.echo(f"a: {_label(a)}; b: {right}", err=True)
        return
    click.echo(f"A: {_label(a)}\nB: {right}")
    click.echo(diff_table(frame, "A", "B"), nl=False)
