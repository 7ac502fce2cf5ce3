"""``fleetlens traces compare``: what is different about a selection of a search's requests
(a time span and a latency band) from the rest, each difference with the ``fleetlens
traces`` command that opens its selected requests. The comparison runs in
:mod:`analytics.traces.compare`; this module parses flags and prints."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from fleetlens.analytics.cli import _CONFIG, _DATA_DIR, _root
from fleetlens.analytics.traces.cli_options import filter_options, parse_time, query_of
from fleetlens.analytics.traces.heatmap import METRICS
from fleetlens.analytics.traces.query import SearchError, parse_number
from fleetlens.pipeline.output import format_option, render_rows
from fleetlens.pipeline.schema import columns as c

if TYPE_CHECKING:
    import polars as pl

    from fleetlens.analytics.traces.compare import Comparison

_EPILOG = f"""Examples:

\b
  fleetlens traces compare --metric {c.E2E_S} --from 2026-12-01T10:02 --to 2026-12-01T10:07 \\
      --min-latency 4 --service chat-8b
  fleetlens traces compare --metric {c.QUEUE_S} --min-latency 1 --since 2h --format json
"""
#: Selection edges when a flag leaves one open: every arrival.
_EARLIEST, _LATEST = 0, 2**63 - 1


def differences_frame(result: Comparison, *extra: str) -> pl.DataFrame:
    """One row per difference: rank, dimension, value, shares, lift, share of excess, the
    command opening its selected requests (empty when no filter expresses the dimension),
    the trace ids of its slowest selected requests, the values selecting the same requests
    (``same_as``), its instance's GPUs, its share of the band outside the span and whether
    that is as high (``at_any_time``), and the note saying so."""
    import polars as pl

    from fleetlens.analytics.traces.drill import command_of

    return pl.DataFrame([{
        "rank": rank, "dimension": d.dimension, "value": d.value,
        "selected_share": round(d.selected_share, 4), "rest_share": round(d.rest_share, 4),
        "lift": round(d.lift, 3), c.SHARE_OF_EXCESS: round(d.share_of_excess, 4),
        "command": command_of(d.query, *extra) if d.query else "",
        "trace_ids": list(d.trace_ids), "same_as": list(d.same_as), "gpus": list(d.gpus),
        "outside_share": None if d.outside_share is None else round(d.outside_share, 4),
        "at_any_time": d.at_any_time, "note": d.note(),
    } for rank, d in enumerate(result.differences, start=1)], schema_overrides={
        "trace_ids": pl.List(pl.String), "same_as": pl.List(pl.String),
        "gpus": pl.List(pl.String), "outside_share": pl.Float64})


def _table(frame: pl.DataFrame) -> str:
    from fleetlens.analytics.cli_table import _column, _render, _row
    from fleetlens.analytics.cli_table import _table as new_table

    table = new_table()
    for name in ("#", "dimension=value", "selected", "rest", "lift", "of excess", "note"):
        _column(table, name, justify="left" if name in ("dimension=value", "note") else "right")
    for row in frame.iter_rows(named=True):
        _row(table, row["rank"], f"{row['dimension']}={row['value']}",
             f"{row['selected_share']:.0%}", f"{row['rest_share']:.0%}", f"x{row['lift']:.1f}",
             f"{row[c.SHARE_OF_EXCESS]:.0%}", row["note"])
    lines = [f"{row['rank']}. {row['command'] or 'traces: ' + ' '.join(row['trace_ids'])}"
             for row in frame.iter_rows(named=True)]
    return _render(table) + "\nOpen the selected requests of each:\n" + "\n".join(lines) + "\n"


def _latency(text: str | None, flag: str) -> float | None:
    if text is None:
        return None
    value = parse_number(text, flag)
    if value < 0:
        raise SearchError(f"{flag} {text}: a latency is 0 or more")
    return value


@click.command("compare", epilog=_EPILOG)
@_DATA_DIR
@_CONFIG
@click.option("--metric", type=click.Choice(METRICS), default=c.E2E_S, show_default=True,
              help="The latency column the band is of.")
@click.option("--from", "start", default=None,
              help="Selected requests arrive at or after (the time grammar of --since) "
                   "[default: the view's start].")
@click.option("--to", "end", default=None,
              help="Selected requests arrive before [default: the view's end].")
@click.option("--min-latency", "low", default=None, metavar="SECONDS",
              help="Selected requests took at least this (in --metric).")
@click.option("--max-latency", "high", default=None, metavar="SECONDS",
              help="Selected requests took at most this.")
@filter_options
@click.option("--top", type=click.IntRange(1, 100), default=10, show_default=True,
              help="Differences shown at most.")
@format_option()
@click.pass_context
def compare_command(ctx: click.Context, data_dir: str | None, config_file: str | None,
                    metric: str, start: str | None, end: str | None, low: str | None,
                    high: str | None, top: int, fmt: str,
                    **filters: Any) -> None:  # noqa: ANN401 - the filter options
    """What is different about the selected requests (arrived --from/--to, --metric between
    --min-latency and --max-latency) from the rest of the search's requests: dimension
    values by lift (their share of the selection over their share of the rest) and share of
    excess (of the selection's distance from the rest's median), as `fleetlens explain`
    ranks an incident's. Each comes with the command that lists its selected requests."""
    from fleetlens.analytics.traces.compare import Selection, compare_data_dir

    parent = ctx.obj or {}
    data_dir = data_dir or parent.get("data_dir")
    config_file = config_file or parent.get("config_file")
    try:
        if (start, end, low, high) == (None, None, None, None):
            raise SearchError("select something: a time span (--from/--to) and/or a latency "
                              "band (--min-latency/--max-latency)")
        query = query_of(**filters)
        selection = Selection(
            metric, parse_time(start, "--from") or query.start_ns or _EARLIEST,
            parse_time(end, "--to") or query.end_ns or _LATEST,
            _latency(low, "--min-latency"), _latency(high, "--max-latency"))
        result = compare_data_dir(_root(data_dir, config_file), query, selection, top=top)
    except SearchError as exc:
        raise click.ClickException(str(exc)) from None
    extra = ("--data-dir", data_dir) if data_dir else ()
    frame = differences_frame(result, *extra)
    note = (f"{result.selected:,} requests selected, {result.rest:,} in the rest of the view"
            + ("" if frame.height else ": no dimension value stands out"))
    if fmt != "table":
        click.echo(render_rows(frame, fmt), nl=False)
        click.echo(note, err=True)  # stdout stays parseable
        return
    click.echo(note)
    if frame.height:
        click.echo(_table(frame), nl=False)
