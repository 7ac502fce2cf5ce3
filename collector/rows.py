"""Accepted rows -> Arrow, where one unstorable value costs only its own item.

The decoders validate every value the raw tables cannot hold (uint64 counts past int64,
non-finite doubles in JSON, timestamps past 2^63). Should one still slip through, building
the table would raise for the whole request, which the receivers answer as retryable: the
client would retry the same bytes forever and its valid items would never be stored. So on
that (rare) path the rows are converted one by one and the failing ones are rejected through
the partial success, like any other invalid item.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from fleetlens.collector.decode_common import Outcome, Reject
from fleetlens.collector.signals import Signal
from fleetlens.collector.telemetry import log

#: What pyarrow raises for a value its column type cannot hold.
_UNSTORABLE = (pa.ArrowException, OverflowError, ValueError, TypeError)


def to_table(signal: Signal, outcome: Outcome) -> pa.Table:
    """``signal.to_arrow(outcome)``; rows that cannot be converted are moved to the
    outcome's rejected items (so its partial success counts them) instead of failing all."""
    try:
        return signal.to_arrow(outcome)
    except _UNSTORABLE as exc:
        log.warning("%s rows not storable as a batch (%s); converting row by row",
                    signal.folder, exc)
    columns = outcome.columns
    names = list(columns)
    good: list[pa.Table] = []
    for index in range(outcome.rows):
        row: dict[str, list[Any]] = {name: [columns[name][index]] for name in names}
        try:
            good.append(pa.Table.from_pydict(row, schema=signal.arrow_schema))
        except _UNSTORABLE as exc:
            outcome.reject(f"accepted row {index}", Reject(f"value not storable: {exc}"))
    outcome.rows = len(good)
    if not good:
        outcome.columns = {name: [] for name in names}
        return signal.to_arrow(outcome)
    return pa.concat_tables(good)
