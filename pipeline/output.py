"""One output flag for every command that prints rows: ``--format table|json|csv``.

``table`` is for reading (each command draws its own, through :mod:`pipeline.terminal`, so
telemetry is never taken as markup); ``json`` is a list of objects and ``csv`` a header and
rows, both with the values as stored (nested values, e.g. evidence, as JSON text in CSV).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    import polars as pl

FORMATS = ("table", "json", "csv")
F = TypeVar("F", bound=Callable[..., Any])


def format_option(*choices: str, default: str = "table") -> Callable[[F], F]:
    """The ``--format`` option, with ``choices`` (default: table, json, csv)."""
    return click.option("--format", "fmt", type=click.Choice(list(choices or FORMATS)),
                        default=default, show_default=True,
                        help="table to read; json or csv to process (values as stored).")


def refresh_option() -> Callable[[F], F]:
    """The ``--refresh/--no-refresh`` option of the commands that print a computed table."""
    return click.option("--refresh/--no-refresh", default=None,
                        help="Recompute from the data first [default: only if never computed].")


def render_rows(frame: pl.DataFrame, fmt: str) -> str:
    """``frame`` as JSON (a list of objects) or CSV (nested values as JSON text)."""
    import polars as pl

    if fmt == "json":
        return json.dumps(frame.to_dicts(), indent=2, default=str) + "\n"
    if fmt == "csv":
        nested = [name for name, dtype in frame.schema.items()
                  if isinstance(dtype, pl.List | pl.Struct | pl.Array | pl.Object)]
        flat = frame.with_columns(
            pl.Series(name, [None if v is None else json.dumps(v, default=str)
                             for v in frame[name].to_list()], dtype=pl.String)
            for name in nested)
        return flat.write_csv()
    raise ValueError(f"no row rendering for format {fmt!r}")
