"""What a trace search asks for: :class:`TraceQuery`, and the parsers of its text forms.

Input: the words a user types (``e2e_s=2``, ``gen_ai.request.model=llama``, ``-e2e_s``).
Output: validated, typed filters. Nothing here touches data; column names are checked against
the columns the ``requests`` table actually has in :mod:`analytics.traces.search`, where the
SQL is built. A bad filter is a :class:`SearchError` with a one-line message for the user.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from fleetlens.pipeline.schema import columns as c


class SearchError(ValueError):
    """A filter, sort key or page the search cannot run: its message is for the user."""


#: Attribute comparison operators, longest first so ``>=`` is not read as ``>``.
OPERATORS = (">=", "<=", "!=", "=", ">", "<")
#: Operators that compare numbers: their value must be one.
NUMERIC_OPERATORS = frozenset({">=", "<=", ">", "<"})
_ATTR = re.compile(r"^\s*(?P<key>[^=<>!]+?)\s*(?:(?P<op>>=|<=|!=|=|>|<)(?P<value>.*))?$",
                   re.DOTALL)
#: The most rows one page may hold: a larger page is a bulk export, which ``sql`` is for.
MAX_LIMIT = 10_000


@dataclass(frozen=True)
class AttrFilter:
    """A condition on one span or resource attribute: ``op`` is ``exists`` (no value) or
    one of :data:`OPERATORS`; ``number`` is ``value`` as a float when it reads as one."""

    key: str
    op: str
    value: str | None = None
    number: float | None = None

    def __str__(self) -> str:
        return self.key if self.op == "exists" else f"{self.key}{self.op}{self.value}"


@dataclass(frozen=True)
class Bound:
    """``column >= low`` and/or ``column <= high`` on a numeric column of ``requests``."""

    column: str
    low: float | None = None
    high: float | None = None


@dataclass(frozen=True)
class TraceQuery:
    """A search over ``requests``: every filter set must hold (values of one filter are
    alternatives). Empty tuples and ``None`` mean "any". Times are ns, half-open
    ``[start_ns, end_ns)`` on ``arrival_ns``."""

    start_ns: int | None = None
    end_ns: int | None = None
    services: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    hosts: tuple[str, ...] = ()
    instances: tuple[str, ...] = ()
    gpus: tuple[str, ...] = ()
    gpu_models: tuple[str, ...] = ()
    regions: tuple[str, ...] = ()
    finish_reasons: tuple[str, ...] = ()
    error: bool | None = None
    bounds: tuple[Bound, ...] = ()
    attrs: tuple[AttrFilter, ...] = ()
    #: the span carrying ``attrs`` has one of these names (Jaeger's "operation")
    span_names: tuple[str, ...] = ()
    #: column name, descending when ``descending``; ties broken by trace and span id
    sort: str = c.ARRIVAL_NS
    descending: bool = True
    limit: int = 50
    offset: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.limit <= MAX_LIMIT:
            raise SearchError(f"limit must be between 1 and {MAX_LIMIT:,}, got {self.limit}")
        if self.offset < 0:
            raise SearchError(f"offset must be 0 or more, got {self.offset}")
        if None not in (self.start_ns, self.end_ns) and self.start_ns >= self.end_ns:
            raise SearchError("the time range is empty: its start is not before its end")


def parse_number(text: str, what: str) -> float:
    """``text`` as a finite float, or a :class:`SearchError` naming ``what``."""
    try:
        number = float(text)
    except ValueError:
        raise SearchError(f"{what}: {text!r} is not a number") from None
    if not math.isfinite(number):
        raise SearchError(f"{what}: {text!r} is not a finite number")
    return number


def parse_attr(text: str) -> AttrFilter:
    """``key`` (exists), ``key=value``, ``key!=value`` or ``key>3`` (also ``>=``, ``<``,
    ``<=``) as an :class:`AttrFilter`. Values are compared as text, and as numbers when both
    sides read as one (``=1`` matches a stored ``1.0``)."""
    match = _ATTR.match(text)
    if match is None or not match["key"].strip():
        raise SearchError(f"--attr {text!r}: expected KEY, KEY=VALUE, KEY!=VALUE or KEY>N "
                          "(also >=, <, <=)")
    key, op, value = match["key"].strip(), match["op"], match["value"]
    if op is None:
        return AttrFilter(key, "exists")
    value = value.strip()
    if op in NUMERIC_OPERATORS:
        return AttrFilter(key, op, value, parse_number(value, f"--attr {text!r}"))
    try:
        number: float | None = float(value)
    except ValueError:
        number = None
    return AttrFilter(key, op, value, number if number is None or math.isfinite(number)
                      else None)


def parse_bound(text: str, flag: str) -> tuple[str, float]:
    """``column=number`` (``--min``/``--max``) as (column, number)."""
    column, sep, value = text.partition("=")
    if not sep or not column.strip():
        raise SearchError(f"{flag} {text!r}: expected COLUMN=NUMBER, e.g. {flag} "
                          f"{c.E2E_S}=2")
    return column.strip(), parse_number(value.strip(), f"{flag} {text!r}")


def merge_bounds(lows: list[tuple[str, float]], highs: list[tuple[str, float]]
                 ) -> tuple[Bound, ...]:
    """``--min`` and ``--max`` pairs as one :class:`Bound` per column (the tightest)."""
    columns = dict.fromkeys(col for col, _ in [*lows, *highs])
    out = []
    for column in columns:
        low = max((v for col, v in lows if col == column), default=None)
        high = min((v for col, v in highs if col == column), default=None)
        if low is not None and high is not None and low > high:
            raise SearchError(f"--min {column}={low:g} is above --max {column}={high:g}: "
                              "nothing can match")
        out.append(Bound(column, low, high))
    return tuple(out)


def parse_sort(text: str) -> tuple[str, bool]:
    """``column`` (ascending) or ``-column`` (descending) as (column, descending)."""
    text = text.strip()
    descending = text.startswith("-")
    column = text.lstrip("+-").strip()
    if not column:
        raise SearchError(f"--sort {text!r}: expected a column, e.g. -{c.E2E_S}")
    return column, descending
