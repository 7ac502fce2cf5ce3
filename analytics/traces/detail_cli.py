"""``fleetlens traces show ID``: one trace in full on the terminal (spans with times to the
millisecond, attributes, resource attributes, events, links, the request's phases and
energy, its instance's signals while it ran) or as JSON. The trace comes from
:func:`analytics.traces.detail.trace_detail`; this module parses flags and prints."""

from __future__ import annotations

import datetime as dt
import json
from typing import TYPE_CHECKING, Any

import click

from fleetlens.analytics.cli import _CONFIG, _DATA_DIR, _root
from fleetlens.analytics.traces.query import SearchError
from fleetlens.pipeline.output import format_option
from fleetlens.pipeline.schema import columns as c

if TYPE_CHECKING:
    import polars as pl

    from fleetlens.analytics.traces.detail import TraceDetail

NS = 1_000_000_000
#: The sections of the output, in order: (TraceDetail field, heading).
SECTIONS = (("spans", "Spans"), ("requests", "Requests"), ("attributes", "Attributes"),
            ("events", "Events"), ("links", "Links"), ("signals", "Instance signals"))


def utc_ms(ns: int) -> str:
    """``2026-09-21 12:00:00.123`` (UTC, to the millisecond)."""
    return dt.datetime.fromtimestamp(ns / NS, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _cell(name: str, value: Any) -> str:  # noqa: ANN401 - any stored value
    if value is None:
        return "-"
    if name.endswith("_ns") and isinstance(value, int):
        return utc_ms(value)
    if name.endswith("_ms"):
        return f"{value:,.3f}"
    if name.endswith("_s") and isinstance(value, float):
        return f"{value * 1e3:,.3f} ms"
    if isinstance(value, float):
        return f"{value:,.6g}"
    return str(value)


def section_table(frame: pl.DataFrame) -> str:
    """A frame of :class:`TraceDetail` as a terminal table (times to the millisecond)."""
    from fleetlens.analytics.cli_table import _column, _render, _row, _table

    table = _table()
    for name in frame.columns:
        _column(table, name)
    for row in frame.iter_rows(named=True):
        _row(table, *(_cell(k, v) for k, v in row.items()))
    return _render(table)


def as_json(detail: TraceDetail) -> str:
    """The whole detail as one JSON object: ``trace_id``, ``start_ns`` and a list of rows
    per section (values as stored; times in ns, offsets in ms)."""
    out: dict[str, Any] = {c.TRACE_ID: detail.trace_id, c.START_NS: detail.start_ns}
    out.update({name: getattr(detail, name).to_dicts() for name, _ in SECTIONS})
    return json.dumps(out, indent=2, default=str, ensure_ascii=False) + "\n"


def as_text(detail: TraceDetail) -> str:
    """Every section under its heading; an empty one says so in one line."""
    parts = [f"trace {detail.trace_id}, started {utc_ms(detail.start_ns)} UTC "
             "(offsets in ms since then)\n"]
    for name, heading in SECTIONS:
        frame = getattr(detail, name)
        parts.append(f"\n{heading}: " + ("none stored\n" if frame.is_empty() else
                                         f"{frame.height}\n" + section_table(frame)))
    return "".join(parts)


@click.command("show")
@click.argument("ident", metavar="TRACE_ID")
@_DATA_DIR
@_CONFIG
@format_option("table", "json")
@click.pass_context
def show_command(ctx: click.Context, ident: str, data_dir: str | None,
                 config_file: str | None, fmt: str) -> None:
    """Show trace TRACE_ID (or the trace of a request id) in full: every span with its
    attributes, resource attributes, events and links, times to the millisecond; its
    requests' phases and energy; and the KV usage, batch, queue, SM clock and power of each
    request's instance while it ran."""
    from fleetlens.analytics.traces.detail import TABLES, trace_detail
    from fleetlens.pipeline.storage import connect

    parent = ctx.obj or {}
    root = _root(data_dir or parent.get("data_dir"), config_file or parent.get("config_file"))
    con = connect(root, tables=TABLES)
    try:
        detail = trace_detail(con, ident)
    except SearchError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        con.close()
    click.echo(as_json(detail) if fmt == "json" else as_text(detail), nl=False)
