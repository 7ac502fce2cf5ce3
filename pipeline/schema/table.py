"""A table of the contract and the dtype names its columns are written with.

Dtypes are kept by their Polars names, so that importing the contract does not import
Polars: the collector reads column names and writes Arrow without it (about 45 MiB less RSS
per process). :attr:`Table.columns` gives the Polars dtypes (importing Polars on first use).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import polars as pl

I64 = "Int64"
F64 = "Float64"
STR = "String"
BOOL = "Boolean"


def list_of(inner: str) -> str:
    """The dtype name of a list of ``inner``: ``"List[Int64]"``."""
    return f"List[{inner}]"


def polars_dtype(name: str) -> Any:
    """The Polars dtype of a dtype name of the contract (``"Int64"``, ``"List[Float64]"``)."""
    import polars as pl

    if name.startswith("List[") and name.endswith("]"):
        return pl.List(polars_dtype(name[5:-1]))
    return getattr(pl, name)


@dataclass(frozen=True)
class Table:
    """One table of the contract.

    Attributes:
        name: the table name, also its folder under ``raw/`` or ``derived/``.
        dtypes: required columns in order, name -> Polars dtype name (see :data:`I64`);
            :attr:`columns` has the Polars dtypes.
        raw_signal: for raw tables, the folder under ``raw/`` (``spans``, ``metrics``, ``logs``);
            ``None`` for derived tables.
        key: the columns that identify a row (used for deduplication and idempotent rewrites).
    """

    name: str
    dtypes: dict[str, str]
    raw_signal: str | None = None
    key: tuple[str, ...] = ()

    @cached_property
    def columns(self) -> dict[str, pl.DataType]:
        """Required columns in order, name -> Polars dtype (imports Polars)."""
        return {name: polars_dtype(dtype) for name, dtype in self.dtypes.items()}

    @property
    def schema(self) -> pl.Schema:
        """The required columns as a :class:`polars.Schema`."""
        import polars as pl

        return pl.Schema(self.columns)

    def empty(self) -> pl.DataFrame:
        """A zero-row frame with exactly the required columns."""
        import polars as pl

        return pl.DataFrame(schema=self.schema)
