"""Accepted rows -> Arrow, where one unstorable value costs only its own item.

The decoders validate every value the raw tables cannot hold (uint64 counts past int64,
non-finite doubles in JSON, timestamps past 2^63). Should one still slip through, building
the table would raise for the whole request, which the receivers answer as retryable: the
client would retry the same bytes forever and its valid items would never be stored. So on
that (rare) path the rows are converted one by one and the failing ones are rejected through
the partial success, like any other invalid item.

Resource and scope columns (:data:`SHARED_COLUMNS`) carry one value per resource or scope,
repeated on each of its rows (issue 16, item 4): they are buffered dictionary-encoded, each
distinct text once per request plus a 4-byte index per row. A request of 400 spans under a
1.5 MB resource is then 1.5 MB of Arrow strings, not 600 MB, and the buffer accounting
(:func:`table_bytes`) counts it once. ``Segments.publish`` writes them as plain strings.
"""

from __future__ import annotations

from itertools import groupby, repeat
from typing import Any

import pyarrow as pa

from fleetlens.collector.decode_common import SHARED_COLUMNS, Outcome, Reject
from fleetlens.collector.signals import Signal
from fleetlens.collector.telemetry import log

#: What pyarrow raises for a value its column type cannot hold.
_UNSTORABLE = (pa.ArrowException, OverflowError, ValueError, TypeError)
SHARED_TYPE = pa.dictionary(pa.int32(), pa.large_string())
_BUFFER_SCHEMAS: dict[str, pa.Schema] = {}


def buffer_schema(signal: Signal) -> pa.Schema:
    """``signal.arrow_schema`` with the string columns of :data:`SHARED_COLUMNS` as
    dictionaries: the schema of every table the collector buffers."""
    schema = _BUFFER_SCHEMAS.get(signal.folder)
    if schema is None:
        plain = signal.arrow_schema
        schema = pa.schema(
            [f.with_type(SHARED_TYPE) if f.name in SHARED_COLUMNS
             and pa.types.is_large_string(f.type) else f for f in plain],
            metadata=plain.metadata)
        _BUFFER_SCHEMAS[signal.folder] = schema
    return schema


def plain_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with dictionary columns as their value type (what readers must see)."""
    return pa.schema([f.with_type(f.type.value_type) if pa.types.is_dictionary(f.type) else f
                      for f in schema], metadata=schema.metadata)


def shared_array(values: list[Any]) -> pa.DictionaryArray:
    """A dictionary array of ``values``, each distinct text stored once.

    The decoders repeat one object per resource or scope, so the values come in runs:
    ``groupby`` walks them in C (equal objects compare by identity first, no text is read)
    and only each run's value is hashed, once. Hashing every row, as Arrow's dictionary
    builder would, reads the whole repeated text: rows x size again, in CPU.
    """
    first = values[0] if values else None
    if first is not None and values.count(first) == len(values):
        # The common case, one resource or scope per request: one text, every index 0
        # (list.count compares by identity first). 7 us instead of about 30-200.
        zeros = pa.py_buffer(bytes(4 * len(values)))
        return pa.DictionaryArray.from_arrays(
            pa.Array.from_buffers(pa.int32(), len(values), [None, zeros]),
            pa.array([first], type=pa.large_string()))
    codes: dict[str, int] = {}
    run_codes: list[int] = []
    lengths: list[int] = []
    for value, run in groupby(values):
        if value is None:
            run_codes.append(-1)
        else:
            run_codes.append(codes.setdefault(value, len(codes)))
        lengths.append(len(list(run)))
    # No numpy in a worker (collector/supervisor.py): several runs are the rare case.
    indices: list[int | None] = []
    for code, length in zip(run_codes, lengths, strict=True):
        indices.extend(repeat(None if code < 0 else code, length))
    return pa.DictionaryArray.from_arrays(
        pa.array(indices, type=pa.int32()),
        pa.array(list(codes), type=pa.large_string()))


def table_bytes(table: pa.Table) -> int:
    """Bytes of the buffers ``table`` holds: what buffering it costs.

    ``Table.nbytes`` counts only the bytes the rows reference, walking every array (0.065 ms
    for a 512-span table, twice per Export: 0.25 us per span); this sums the buffers whole
    (2.5 us), never less than what the table keeps alive.
    """
    return table.get_total_buffer_size()


def build_table(signal: Signal, columns: dict[str, list[Any]]) -> pa.Table:
    """Columns (exactly ``signal``'s) as a table of :func:`buffer_schema`."""
    schema = buffer_schema(signal)
    arrays = [shared_array(columns[f.name]) if pa.types.is_dictionary(f.type)
              else pa.array(columns[f.name], type=f.type) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


def to_table(signal: Signal, outcome: Outcome) -> pa.Table:
    """The accepted rows as a table of :func:`buffer_schema`; rows that cannot be converted
    are moved to the outcome's rejected items (so its partial success counts them) instead
    of failing all."""
    try:
        return build_table(signal, outcome.columns)
    except _UNSTORABLE as exc:
        log.warning("%s rows not storable as a batch (%s); converting row by row",
                    signal.folder, exc)
    columns = outcome.columns
    names = list(columns)
    good: list[int] = []
    for index in range(outcome.rows):
        row: dict[str, list[Any]] = {name: [columns[name][index]] for name in names}
        try:
            build_table(signal, row)
        except _UNSTORABLE as exc:
            outcome.reject(f"accepted row {index}", Reject(f"value not storable: {exc}"))
        else:
            good.append(index)
    outcome.rows = len(good)
    outcome.columns = {name: [columns[name][i] for i in good] for name in names}
    return build_table(signal, outcome.columns)
