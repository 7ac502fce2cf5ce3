"""Observability for pipeline stages in one place: the :func:`stage` decorator.

Every stage is a pure function from frames to a frame. The decorator checks the output against
its table's contract, counts rows in and out, times the call and records it in
:data:`STATS` (and the ``fleetlens.pipeline`` logger), so the stages themselves stay free of
logging and bookkeeping.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ParamSpec, TypeVar

import polars as pl

from fleetlens.pipeline.schema import validate

log = logging.getLogger("fleetlens.pipeline")

P = ParamSpec("P")
F = TypeVar("F", pl.DataFrame, pl.LazyFrame)


@dataclass
class StageRecord:
    """One call of a stage."""

    name: str
    rows_in: int
    rows_out: int
    seconds: float


@dataclass
class StageStats:
    """Calls of every stage since the last :meth:`reset` (read by the CLI and the benchmark)."""

    records: list[StageRecord] = field(default_factory=list)

    def reset(self) -> None:
        self.records.clear()

    def totals(self) -> dict[str, StageRecord]:
        """Rows and seconds summed per stage name, in first-call order."""
        out: dict[str, StageRecord] = {}
        for rec in self.records:
            tot = out.setdefault(rec.name, StageRecord(rec.name, 0, 0, 0.0))
            tot.rows_in += rec.rows_in
            tot.rows_out += rec.rows_out
            tot.seconds += rec.seconds
        return out


STATS = StageStats()


def _rows(value: object) -> int:
    if isinstance(value, pl.DataFrame):
        return value.height
    return 0


def stage(output_table: str | None) -> Callable[[Callable[P, F]], Callable[P, F]]:
    """Wrap a stage: validate its output against ``output_table``, count rows, time it.

    A stage returning a LazyFrame is validated through its schema only (nothing is collected);
    its rows are counted as 0 because counting would run the plan.

    Args:
        output_table: the contract table the stage produces, or ``None`` for an internal
            intermediate frame (not validated).
    """

    def decorate(func: Callable[P, F]) -> Callable[P, F]:
        @functools.wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> F:
            rows_in = sum(_rows(a) for a in (*args, *kwargs.values()))
            began = time.perf_counter()
            result = func(*args, **kwargs)
            if output_table is not None:
                validate(result, output_table)
            seconds = time.perf_counter() - began
            rec = StageRecord(func.__name__, rows_in, _rows(result), seconds)
            STATS.records.append(rec)
            log.debug("stage %s: %d rows in, %d rows out, %.3f s",
                      rec.name, rec.rows_in, rec.rows_out, rec.seconds)
            return result

        return wrapper

    return decorate
