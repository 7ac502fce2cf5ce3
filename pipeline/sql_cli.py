"""``fleetlens sql``: ad-hoc SQL over every table in a data directory."""

from __future__ import annotations

import re
import sys
from typing import TYPE_CHECKING

import click

from fleetlens.pipeline.schema import TABLES
from fleetlens.pipeline.schema.settings import DATA_DIR_HELP

if TYPE_CHECKING:
    import polars as pl

_MISSING_TABLE = re.compile(r"Table with name (\S+) does not exist", re.IGNORECASE)


@click.command()
@click.argument("query")
@click.option("--data-dir", "data_dir", type=click.Path(file_okay=False), default=None,
              help=DATA_DIR_HELP)
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table",
              show_default=True, help="Output format.")
@click.option("--max-rows", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Rows printed in table format (csv and json print all).")
def sql(query: str, data_dir: str | None, fmt: str, max_rows: int) -> None:
    """Run one read-only QUERY with DuckDB over the data directory.

    Every fleetlens table is a view (empty until it has data): raw spans,
    metric_points and log_records, and the derived requests, windows, gpu_samples,
    engine_samples, request_energy, gpu_window_energy, baselines, incidents and
    causes (and the internal instance_gpus and gpu_slot_energy). Example:

        fleetlens sql "select service_name, count(*) from spans group by 1"

    QUERY is one SELECT (WITH, FROM, DESCRIBE, SHOW and SUMMARIZE are SELECTs too)
    or EXPLAIN; nothing that writes (COPY, ATTACH, CREATE, ...) runs, so a query
    cannot change the data directory. To export, use --format csv or json and
    redirect the output.
    """
    import duckdb

    from fleetlens.pipeline.cli import resolve_data_dir
    from fleetlens.pipeline.storage import (
        connect,
        existing_tables,
        retry_vanished,
        tables_named_in,
    )

    _refuse_writes(query)
    root = resolve_data_dir(data_dir, None)

    def run() -> pl.DataFrame:
        # Views of the tables the query names only (making them reads the files' footers);
        # a query that names none (SHOW TABLES, information_schema) gets them all.
        con = connect(root, tables=tables_named_in(query) or None)
        return con.sql(query).pl()

    try:
        frame = retry_vanished(run)  # compaction may delete a segment the query listed
    except duckdb.CatalogException as exc:
        if not _MISSING_TABLE.search(str(exc)):
            raise click.ClickException(f"query failed: {exc}") from None
        present = existing_tables(root)
        raise click.ClickException(
            f"{exc}\nfleetlens tables: {', '.join(TABLES)}"
            f"\ntables with data in {root.root}: {', '.join(present) or 'none yet'}"
        ) from None
    except duckdb.Error as exc:
        raise click.ClickException(f"query failed: {exc}") from None
    if fmt == "csv":
        frame.write_csv(sys.stdout)
    elif fmt == "json":
        click.echo(frame.write_json())
    else:
        _print_table(frame, max_rows)


def _refuse_writes(query: str) -> None:
    """Raise a usage error unless ``query`` is exactly one SELECT or EXPLAIN statement."""
    import duckdb

    try:
        statements = duckdb.connect(":memory:").extract_statements(query)
    except duckdb.Error as exc:
        raise click.ClickException(f"query failed: {exc}") from None
    if len(statements) != 1:
        raise click.UsageError(f"expected one query, got {len(statements)} statements")
    kind = statements[0].type
    if kind not in (duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN):
        raise click.UsageError(
            f"only read-only queries run here (got {kind.name}); to save a result, use "
            "--format csv or json and redirect it to a file")


def _print_table(frame, max_rows: int) -> None:  # noqa: ANN001 - polars DataFrame
    from rich.console import Console
    from rich.table import Table

    table = Table(show_edge=False, header_style="bold")
    for name in frame.columns:
        table.add_column(name, overflow="fold")
    for row in frame.head(max_rows).iter_rows():
        table.add_row(*("" if v is None else str(v) for v in row))
    console = Console()
    console.print(table)
    shown = min(frame.height, max_rows)
    console.print(f"({frame.height} row{'s' if frame.height != 1 else ''}"
                  f"{f', first {shown} shown' if shown < frame.height else ''})")
