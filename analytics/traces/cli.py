"""``fleetlens traces``: search requests and their traces; ``fleetlens traces export``: one
trace as OTLP/JSON; ``fleetlens traces show`` (:mod:`analytics.traces.detail_cli`): one
trace in full; ``fleetlens traces compare`` (:mod:`analytics.traces.compare_cli`): what
is different about a selection of them; ``fleetlens traces diff`` (:mod:`.side_by_side_cli`):
two requests side by side. The search runs in :mod:`analytics.traces.search`;
this module parses flags and prints."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

import click

from fleetlens.analytics.cli import _CONFIG, _DATA_DIR, _root, write_output
from fleetlens.analytics.traces.cli_options import filter_options, query_of
from fleetlens.analytics.traces.compare_cli import compare_command
from fleetlens.analytics.traces.detail_cli import show_command
from fleetlens.analytics.traces.query import MAX_LIMIT, SearchError, parse_sort
from fleetlens.analytics.traces.side_by_side_cli import diff_command
from fleetlens.pipeline.output import format_option, render_rows
from fleetlens.pipeline.schema import columns as c

if TYPE_CHECKING:
    import polars as pl

NS = 1_000_000_000
_EPILOG = f"""Examples:

\b
  fleetlens traces --since 2h --service chat-8b --min {c.E2E_S}=2 --sort -{c.E2E_S}
  fleetlens traces --host gpu-07 --errors --format json
  fleetlens traces --attr gen_ai.request.max_tokens>=1024 --attr region=eu-west
  fleetlens traces show 4bf92f3577b34da6a3ce929d0e0e4736
  fleetlens traces export 4bf92f3577b34da6a3ce929d0e0e4736 -o trace.json
  fleetlens traces compare --metric e2e_s --from 1h --to 50m --min-latency 4
  fleetlens traces diff REQUEST_ID            (against the median around it)
"""


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:,.0f}"


def _at(ns: int) -> str:
    return dt.datetime.fromtimestamp(ns / NS, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def results_table(rows: pl.DataFrame) -> str:
    """One line per request: trace id, arrival, where it ran, e2e and its phase split in ms,
    tokens and how it finished. Telemetry strings go through :func:`pipeline.terminal.cell`."""
    from fleetlens.analytics.cli_table import _column, _key_column, _render, _row, _table

    table = _table()
    _key_column(table, "trace id")
    _key_column(table, "arrival (UTC)")
    for name in ("service", "model", "host"):
        _column(table, name)
    for name in ("e2e ms", "queue", "prefill", "decode", "other", "in/out tok", "finish"):
        _column(table, name, justify="right" if name != "finish" else "left")
    for row in rows.iter_rows(named=True):
        finish = row.get(c.FINISH_REASON) or "-"
        _row(table, row[c.TRACE_ID], _at(row[c.ARRIVAL_NS]), row[c.SERVICE_NAME],
             row[c.MODEL], row[c.HOST_NAME], _ms(row[c.E2E_S]), _ms(row[c.QUEUE_S]),
             _ms(row[c.PREFILL_S]), _ms(row[c.DECODE_S]), _ms(row[c.OVERHEAD_S]),
             f"{row[c.INPUT_TOKENS]}/{row[c.OUTPUT_TOKENS]}",
             f"{finish} ERROR" if row[c.IS_ERROR] else finish)
    return _render(table)


def page_note(total: int, offset: int, shown: int) -> str:
    """``requests 1-20 of 345; --offset 20 for the next page`` (or why nothing shows)."""
    if total == 0:
        return "no request matches"
    if shown == 0:
        return f"{total} requests match; --offset {offset} is past the last"
    note = f"requests {offset + 1}-{offset + shown} of {total}"
    if offset + shown < total:
        note += f"; --offset {offset + shown} for the next page"
    return note


@click.group(invoke_without_command=True, epilog=_EPILOG)
@_DATA_DIR
@_CONFIG
@filter_options
@click.option("--sort", "sort", default=f"-{c.ARRIVAL_NS}", show_default=True,
              metavar="[-]COLUMN", help="Sort by a requests column; '-' for descending.")
@click.option("--limit", type=click.IntRange(1, MAX_LIMIT), default=50, show_default=True,
              help="Requests per page.")
@click.option("--offset", type=click.IntRange(min=0), default=0, show_default=True,
              help="Skip this many (the next page: --offset plus --limit).")
@format_option()
@click.pass_context
def traces(ctx: click.Context, data_dir: str | None, config_file: str | None, sort: str,
           limit: int, offset: int, fmt: str, **filters: Any) -> None:  # noqa: ANN401
    """Search requests and their traces: by time, service, model, host, instance, GPU,
    region, finish reason, error, any latency or token column and any span attribute.

    Each row is one request with its phase split (queue, prefill, decode, other = e2e minus
    the three); its trace id opens the trace in the dashboard or `fleetlens traces export`.
    """
    ctx.ensure_object(dict)
    ctx.obj.update(data_dir=data_dir, config_file=config_file)
    if ctx.invoked_subcommand is not None:
        # `traces --host h1 export ID` would otherwise drop the filter without a word
        given = [param.opts[0] for param in ctx.command.params
                 if param.name not in ("data_dir", "config_file") and
                 ctx.get_parameter_source(param.name) is not click.core.ParameterSource.DEFAULT]
        if given:
            raise click.UsageError(f"`traces {ctx.invoked_subcommand}` takes no search "
                                   f"options ({', '.join(sorted(given))})")
        return
    from fleetlens.analytics.traces.search import search_data_dir

    try:
        column, descending = parse_sort(sort)
        query = query_of(**filters, sort=column, descending=descending, limit=limit,
                         offset=offset)
        result = search_data_dir(_root(data_dir, config_file), query)
    except SearchError as exc:
        raise click.ClickException(str(exc)) from None
    note = page_note(result.total, offset, result.rows.height)
    if fmt != "table":
        click.echo(render_rows(result.rows, fmt), nl=False)
        click.echo(note, err=True)  # stdout stays parseable
        return
    if result.rows.height:
        click.echo(results_table(result.rows), nl=False)
    click.echo(note)


@traces.command("export")
@click.argument("ident", metavar="TRACE_ID")
@_DATA_DIR
@click.option("--output", "-o", type=click.Path(dir_okay=False), default=None,
              help="Write to this file instead of stdout.")
@click.pass_context
def export(ctx: click.Context, ident: str, data_dir: str | None, output: str | None) -> None:
    """Write trace TRACE_ID (or the trace of a request id) as OTLP/JSON: load it into Jaeger
    or Tempo, or POST it to any OTLP/HTTP receiver's /v1/traces."""
    from fleetlens.analytics.traces.otlp_export import otlp_json
    from fleetlens.pipeline.schema import tables as t
    from fleetlens.pipeline.storage import connect

    parent = ctx.obj or {}
    root = _root(data_dir or parent.get("data_dir"), parent.get("config_file"))
    con = connect(root, tables=(t.REQUESTS, t.SPANS))
    try:
        text = otlp_json(con, ident)
    except SearchError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        con.close()
    if output:
        write_output(output, text)
    else:
        click.echo(text, nl=False)


traces.add_command(compare_command)
traces.add_command(diff_command)
traces.add_command(show_command)
