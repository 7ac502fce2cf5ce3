"""``fleetlens sql``: ad-hoc SQL over every table in a data directory.

The query runs in :mod:`pipeline.sandbox`, the same read-only, resource-bounded DuckDB as
the dashboard's SQL console; values reach the terminal through :mod:`pipeline.terminal`
(never markup, control characters escaped).
"""

from __future__ import annotations

import re
import sys
from collections import Counter

import click

from fleetlens.pipeline.schema import TABLES
from fleetlens.pipeline.schema.settings import DATA_DIR_HELP

_MISSING_TABLE = re.compile(r"Table with name (\S+) does not exist", re.IGNORECASE)
_SAVE_HINT = "to save a result, use --format csv or json and redirect it to a file"


@click.command()
@click.argument("query")
@click.option("--data-dir", "data_dir", type=click.Path(file_okay=False), default=None,
              help=DATA_DIR_HELP)
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table",
              show_default=True, help="Output format.")
@click.option("--max-rows", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Rows printed in table format (csv and json print all).")
@click.option("--max-result-mb", type=click.IntRange(min=1), default=256, show_default=True,
              help="Largest result (Arrow bytes); csv and json fail past it, a table is cut.")
@click.option("--memory-mb", type=click.IntRange(min=16), default=2048, show_default=True,
              help="DuckDB memory limit; past it the query spills to its temp directory.")
@click.option("--temp-mb", type=click.IntRange(min=1), default=4096, show_default=True,
              help="Most the query may spill to its private temp directory.")
@click.option("--threads", type=click.IntRange(min=1), default=2, show_default=True,
              help="DuckDB worker threads.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0, min_open=True),
              default=None, help="Stop the query after this many seconds [default: never].")
def sql(query: str, data_dir: str | None, fmt: str, max_rows: int, max_result_mb: int,
        memory_mb: int, temp_mb: int, threads: int, timeout_s: float | None) -> None:
    """Run one read-only QUERY with DuckDB over the data directory.

    Every fleetlens table is a view (empty until it has data): raw spans,
    metric_points and log_records, and the derived requests, windows, gpu_samples,
    engine_samples, request_energy, gpu_window_energy, baselines, incidents and
    causes (and the internal instance_gpus and gpu_slot_energy). Example:

        fleetlens sql "select service_name, count(*) from spans group by 1"

    QUERY is one SELECT (WITH, FROM, DESCRIBE, SHOW and SUMMARIZE are SELECTs too)
    or EXPLAIN [ANALYZE] of one; nothing that writes (COPY, ATTACH, CREATE, ...) runs,
    and no file outside the data directory can be read. Memory, threads, temp space and
    the result's size are bounded (the options below). To export, use --format csv or
    json and redirect the output.
    """
    import polars as pl

    from fleetlens.pipeline.cli import resolve_data_dir
    from fleetlens.pipeline.sandbox import (
        NotReadOnly,
        QueryRejected,
        SandboxLimits,
        run_read_only,
    )
    from fleetlens.pipeline.storage import existing_tables

    root = resolve_data_dir(data_dir, None)
    limits = SandboxLimits(memory_mb=memory_mb, threads=threads, temp_mb=temp_mb,
                           result_mb=max_result_mb, timeout_s=timeout_s)
    table = fmt == "table"
    try:
        got = run_read_only(root, query, limits, row_cap=max_rows if table else None,
                            allow_explain=True, count_all=table)
    except NotReadOnly as exc:
        raise click.UsageError(f"{exc}; {_SAVE_HINT}") from None
    except QueryRejected as exc:
        if not _MISSING_TABLE.search(str(exc)):
            raise click.ClickException(str(exc)) from None
        present = existing_tables(root)
        raise click.ClickException(
            f"{exc}\nfleetlens tables: {', '.join(TABLES)}"
            f"\ntables with data in {root.root}: {', '.join(present) or 'none yet'}"
        ) from None
    if got.cut == "bytes" and not table:
        # An export cut short would look complete: refuse it whole instead.
        raise click.ClickException(
            f"the result passed --max-result-mb {max_result_mb} after {got.table.num_rows} "
            "rows; nothing was written. Narrow the query or raise the limit")
    _refuse_duplicate_names(got.table.column_names)
    frame = pl.from_arrow(got.table)
    assert isinstance(frame, pl.DataFrame)
    if fmt in ("csv", "json"):
        text = frame.write_csv() if fmt == "csv" else frame.write_json() + "\n"
        if sys.stdout.isatty():  # read, not redirected: no raw ESC/OSC (or C1) to the terminal
            from fleetlens.pipeline.terminal import plain

            text = plain(text)
        sys.stdout.write(text)
    else:
        _print_table(frame, got.total_rows, got.cut, max_result_mb)


def _print_table(frame, total: int, cut: str | None,  # noqa: ANN001 - polars DataFrame
                 max_result_mb: int) -> None:
    from rich.console import Console
    from rich.table import Table

    from fleetlens.pipeline.terminal import cell, table_width

    table = Table(show_edge=False, header_style="bold")
    for name in frame.columns:  # column names come from the query (and its data): plain too
        table.add_column(cell(name), overflow="fold")
    for row in frame.iter_rows():
        table.add_row(*(cell(v) for v in row))
    console = Console(width=table_width())
    console.print(table)
    shown = frame.height
    note = ""
    if cut == "bytes":
        note = f", first {shown} shown: the rest passed --max-result-mb {max_result_mb}"
    elif shown < total:
        note = f", first {shown} shown"
    console.print(f"({total} row{'s' if total != 1 else ''}{note})", markup=False)


def _refuse_duplicate_names(names: list[str]) -> None:
    """DuckDB returns two columns of one name (``select 1 as s, 2 as s``); no table, CSV
    reader or JSON object tells them apart, so the query is the user's to fix."""
    twice = sorted(name for name, count in Counter(names).items() if count > 1)
    if twice:
        from fleetlens.pipeline.terminal import plain

        listed = ", ".join(repr(plain(name)) for name in twice)
        raise click.ClickException(
            f"the result has more than one column named {listed}: give each its own name "
            "(... AS another_name)")
