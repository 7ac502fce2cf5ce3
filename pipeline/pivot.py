"""Long metric points -> one wide row per (series, timestamp), without touching strings per point.

``metric_points`` has one row per (metric, series, timestamp); ``gpu_samples`` and
``engine_samples`` want one row per (series, timestamp) with one column per metric. At 10 Hz for
64 GPUs that is about 5M points an hour, so two things keep this off the profile:

* a point's source, the (host, service, attributes) strings, is replaced by one int64 code
  (:func:`split_sources`): the strings are read once per distinct combination (a few per GPU or
  instance), never per point;
* each metric's points are sorted by one packed int64 key (series rank, time) and, when every
  metric has exactly the same keys without repeats (a GPU agent samples all its metrics at
  once), the metrics are laid side by side instead of grouped (:func:`pivot_sorted`).
"""

from __future__ import annotations

from typing import NamedTuple

import polars as pl

from fleetlens.pipeline.attrs import code, packed_codes
from fleetlens.pipeline.schema import columns as c

#: The strings that make a point's source: where it comes from and what it measures.
SOURCE = [c.HOST_NAME, c.SERVICE_NAME, c.ATTRIBUTES, c.METRIC_NAME, c.UNIT, c.TEMPORALITY]
#: The int64 code of a point's :data:`SOURCE` combination (valid within one call).
SRC = "__src"
#: Index of the output column a point's value goes to (see :func:`pivot_sorted`).
SLOT = "__slot"
KEY = "__key"


class Split(NamedTuple):
    """Metric points with their source strings replaced by a code (see :func:`split_sources`)."""

    slim: pl.DataFrame
    combos: pl.DataFrame

    def filter(self, predicate: pl.Expr) -> Split:
        """The points of ``slim`` matching ``predicate`` (every combination kept)."""
        return Split(self.slim.filter(predicate), self.combos)


def as_split(points: pl.DataFrame | Split) -> Split:
    """``points`` split into codes and combinations, unless they already are: the samples
    stages accept both, so one hour's points are split once for all three."""
    if isinstance(points, Split):
        return points
    return Split(*split_sources(points, [c.TS_NS, c.VALUE]))


def split_sources(points: pl.DataFrame, keep: list[str]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Replace the :data:`SOURCE` strings of ``points`` by one int64 code, :data:`SRC`.

    Returns ``(slim, combos)``: ``slim`` holds :data:`SRC` and the ``keep`` columns, one row per
    point in input order; ``combos`` one row per distinct combination: :data:`SRC` and the
    :data:`SOURCE` columns as strings (nulls kept). Source columns may be String or Categorical
    (the runner reads them as Parquet dictionaries, so their codes cost nothing).
    """
    key = packed_codes(points, SOURCE)
    if key is None:  # codes too large to pack (a process saw many strings): number the combos
        key = number_combinations(points.select(code(col) for col in SOURCE))
    key = key.alias(SRC)
    first = key.arg_unique()
    combos = points.select(SOURCE).gather(first).with_columns(
        pl.col(SOURCE).cast(pl.String), key.gather(first).alias(SRC))
    slim = points.select(keep).with_columns(key)
    return slim, combos


def number_combinations(codes: pl.DataFrame) -> pl.Series:
    """One Int64 per row of integer ``codes``: the number of its distinct combination (nulls
    equal), for when the codes are too large to pack side by side."""
    distinct = codes.unique().with_row_index(SRC).with_columns(pl.col(SRC).cast(pl.Int64))
    return codes.join(distinct, on=codes.columns, how="left", maintain_order="left",
                      nulls_equal=True).get_column(SRC)


def pivot_sorted(frame: pl.DataFrame, columns: list[str], key: pl.Expr) -> pl.DataFrame:
    """One row per distinct ``key`` (ascending) with one value column per name in ``columns``.

    Args:
        frame: long rows with :data:`SLOT` (index into ``columns``) and ``value``.
        columns: the output value columns.
        key: int64 expression giving each row's (series, time) key.

    Repeated points of one column at one key (duplicate deliveries) collapse to their maximum:
    the value itself for a duplicate, the latest value for a counter.
    """
    long = frame.select(pl.col(SLOT), key.alias(KEY), pl.col(c.VALUE))
    parts: list[pl.DataFrame] = []
    order: pl.Series | None = None
    unsorted_keys: pl.Series | None = None
    for slot, column in enumerate(columns):
        part = long.filter(pl.col(SLOT) == slot).select(KEY, pl.col(c.VALUE).alias(column))
        # An agent sends all metrics of a sample together, so the metrics' keys usually come
        # in the same order: one argsort then serves every metric.
        if order is None or not part.get_column(KEY).equals(unsorted_keys):
            unsorted_keys = part.get_column(KEY)
            order = unsorted_keys.arg_sort()
        part = part[order]
        keys = part.get_column(KEY)
        if keys.len() > 1 and not keys.diff().min() > 0:  # repeats: keep the maximum
            part = part.group_by(KEY).agg(pl.col(column).max()).sort(KEY)
        parts.append(part)
    if not parts:
        return pl.DataFrame(schema={KEY: pl.Int64})
    first = parts[0].get_column(KEY)
    if all(part.get_column(KEY).equals(first) for part in parts[1:]):
        return parts[0].hstack([part.to_series(1) for part in parts[1:]])
    both = pl.concat(parts, how="diagonal")
    return both.group_by(KEY).agg(pl.col(columns).max()).sort(KEY)
