"""Reading keys out of the JSON attribute maps of the raw tables, fast.

Attribute maps are JSON objects stored as strings (TEAM.md conventions). Parsing JSON costs
about 0.6 s per million rows per key, so two shortcuts keep it off the hot path:

* a key absent from every row of a frame is not parsed at all (a literal substring scan,
  about 15 ms per million rows, decides);
* columns with few distinct values (``resource_attributes``: one per process; metric point
  attributes: one per GPU or instance) are parsed once per distinct value and joined back.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import polars as pl

_KEY_COLUMN = "__json_text"
#: Below this many rows the distinct-value shortcut is not worth its categorical cast.
_DISTINCT_MIN_ROWS = 10_000


def json_path(key: str) -> str:
    """The JSONPath of a top-level key that may contain dots (``$['gen_ai.request.model']``)."""
    return "$[" + json.dumps(key).replace("'", "\\'").replace('"', "'") + "]"


def key_expr(column: str, key: str, dtype: pl.DataType) -> pl.Expr:
    """Expression reading top-level ``key`` of the JSON objects in ``column`` as ``dtype``.

    Arrays and objects come back as their JSON text when ``dtype`` is String; values that do not
    convert become null.
    """
    text = pl.col(column).str.json_path_match(json_path(key))
    if dtype == pl.Boolean:
        return text.replace_strict({"true": True, "false": False}, default=None,
                                   return_dtype=pl.Boolean)
    return text.cast(dtype, strict=False)


def extract_keys(
    frame: pl.DataFrame, column: str, keys: dict[str, tuple[str, pl.DataType]]
) -> pl.DataFrame:
    """Add one column per key read from the JSON maps in ``column``; absent keys give nulls.

    Args:
        frame: the frame holding ``column``.
        column: a column of JSON object strings.
        keys: attribute key -> (output column name, dtype).
    """
    if not keys:
        return frame
    texts = frame.get_column(column)
    exprs = []
    for key, (name, dtype) in keys.items():
        present = frame.height > 0 and bool(texts.str.contains(json.dumps(key), literal=True).any())
        exprs.append((key_expr(column, key, dtype) if present else pl.lit(None, dtype)).alias(name))
    return frame.with_columns(exprs)


def extract_keys_distinct(
    frame: pl.DataFrame, column: str, keys: dict[str, tuple[str, pl.DataType]]
) -> pl.DataFrame:
    """Like :func:`extract_keys`, parsing each distinct value of ``column`` once.

    Use it on columns with few distinct values (resource maps, metric point attributes).
    """
    if not keys:
        return frame
    return per_value(frame, column, lambda f: extract_keys(f, column, keys), always=True)


def per_value(frame: pl.DataFrame, column: str,
              derive: Callable[[pl.DataFrame], pl.DataFrame], *, always: bool = False,
              ) -> pl.DataFrame:
    """``derive(frame)``, computed once per distinct value of ``column`` when values repeat.

    ``derive`` must add columns computed from ``column`` alone (JSON keys, regex extracts).
    When ``column`` has fewer than a quarter as many distinct values as rows (or ``always``),
    it runs on the distinct values only and the result is joined back on a categorical code,
    several times faster than on the strings; otherwise on the whole frame. Same result either
    way.
    """
    if not always and (frame.height < _DISTINCT_MIN_ROWS
                       or frame.get_column(column).n_unique() * 4 > frame.height):
        return derive(frame)
    keyed = frame.with_columns(code(column).alias(_KEY_COLUMN))
    distinct = keyed.group_by(_KEY_COLUMN).agg(pl.col(column).first())
    derived = derive(distinct).drop(column)
    return keyed.join(derived, on=_KEY_COLUMN, how="left", maintain_order="left",
                      nulls_equal=True).drop(_KEY_COLUMN)


#: The bits a :func:`packed_codes` key may use (a non-negative int64).
PACK_BITS = 62


def code(column: str) -> pl.Expr:
    """An integer code per distinct string of ``column``, valid within the one result it is
    computed for (two casts of the same strings may number them differently)."""
    return pl.col(column).cast(pl.Categorical).to_physical()


def packed_codes(frame: pl.DataFrame, columns: list[str]) -> pl.Series | None:
    """One int64 per row of ``frame``: the :func:`code` of each of the string ``columns``
    (shifted by one, null as 0: a value of its own, ordered first), packed side by side in as
    few bits as the largest code needs, the first column highest. Equal rows get equal keys,
    and the keys order as the tuples of codes do (what ``pl.struct(codes)`` sorts by), so a
    group-by, window or rank on the key partitions and orders rows as on the codes, hashing
    one integer instead of row-encoding strings. None when the codes need more than
    :data:`PACK_BITS` bits.
    """
    # Cast once: the maxima and the key must see the same codes. The maxima are taken over the
    # raw UInt32 codes (a null is skipped, and 0 stands for it anyway): no shifted Int64 column
    # is materialised per source column (on Categorical input, e.g. the raw metric points'
    # source strings, that pass was half the cost of the key).
    codes = frame.select(code(col).alias(f"__code{i}") for i, col in enumerate(columns))
    maxima = codes.select(pl.all().max()).row(0)
    bits = [int(0 if m is None else m + 1).bit_length() for m in maxima]
    if sum(bits) > PACK_BITS:
        return None
    return codes.select(_pack(codes.columns, bits).alias("__packed")).to_series()


def _pack(columns: list[str], bits: list[int]) -> pl.Expr:
    """Integer code ``columns`` packed into one int64, the first column highest: each code
    shifted by one (null as 0) in ``bits[i]`` bits, which must hold the largest code + 1 (see
    :func:`packed_codes`)."""
    key, shift = pl.lit(0, pl.Int64), 0
    for column, width in zip(reversed(columns), reversed(bits), strict=True):
        key = key + (pl.col(column).cast(pl.Int64) + 1).fill_null(0) * (1 << shift)
        shift += width
    return key


def first_string_of_key(column: str, key: str) -> pl.Expr:
    """The first string of a list-valued top-level ``key``, read without parsing the JSON.

    Matches both ``"key": "[\\"stop\\"]"`` (vLLM: a JSON string holding a list) and
    ``"key": ["stop"]`` (GenAI conventions: an array), and a bare ``"key": "stop"``. About
    ten times faster than :func:`key_expr` on long maps; values with escaped quotes inside are
    cut at the escape.
    """
    quoted = re.escape(json.dumps(key))
    in_list = pl.col(column).str.extract(quoted + r'\s*:\s*"?\[\s*\\?"([^"\\]*)', 1)
    bare = pl.col(column).str.extract(quoted + r'\s*:\s*"([^"\\\[]*)"', 1)
    return pl.coalesce(in_list, bare)
