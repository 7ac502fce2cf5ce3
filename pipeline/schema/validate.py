"""Checks a frame against the table contract at every stage boundary."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from fleetlens.pipeline.schema.tables import table as lookup

if TYPE_CHECKING:  # imported in the functions: the collector imports this package, not Polars
    import polars as pl

F = TypeVar("F", "pl.DataFrame", "pl.LazyFrame")


class SchemaError(ValueError):
    """A frame does not match its table's contract; the message names every bad column."""


def validate(frame: F, table: str) -> F:
    """Check that ``frame`` has every required column of ``table`` with its dtype.

    Extra columns are allowed (dimensions). A LazyFrame is checked through its schema only,
    without collecting.

    Args:
        frame: the DataFrame or LazyFrame to check.
        table: a table name from :data:`pipeline.schema.TABLES`.

    Returns:
        ``frame`` unchanged, so the call can sit inside a ``.pipe`` chain.

    Raises:
        SchemaError: listing missing columns and columns with the wrong dtype.
    """
    import polars as pl

    spec = lookup(table)
    actual = frame.collect_schema() if isinstance(frame, pl.LazyFrame) else frame.schema
    missing = [name for name in spec.columns if name not in actual]
    wrong = [
        f"{name} is {actual[name]}, expected {dtype}"
        for name, dtype in spec.columns.items()
        if name in actual and actual[name] != dtype and actual[name] != pl.Null
    ]
    if missing or wrong:
        parts = []
        if missing:
            parts.append(f"missing columns: {', '.join(missing)}")
        if wrong:
            parts.append(f"wrong dtypes: {'; '.join(wrong)}")
        raise SchemaError(f"table {table!r} does not match its contract: {' | '.join(parts)}")
    return frame


def conform(frame: pl.DataFrame, table: str) -> pl.DataFrame:
    """Return ``frame`` with the table's required columns first, in order, cast to their dtypes.

    Missing required columns are added as nulls; extra columns are kept after them.
    """
    import polars as pl

    spec = lookup(table)
    exprs = [
        (pl.col(name).cast(dtype) if name in frame.columns else pl.lit(None, dtype)).alias(name)
        for name, dtype in spec.columns.items()
    ]
    extras = [pl.col(name) for name in frame.columns if name not in spec.columns]
    return frame.select(exprs + extras)
