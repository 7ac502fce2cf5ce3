"""Rolling robust baselines: median and MAD over the previous N windows of every series.

Always on and cheap: one vectorised pass over all series with ``.over(series)``. The current
window is excluded from its own baseline (``shift(1)``) so a spike cannot raise the bar it is
judged against. The band is ``expected +- max(k x 1.4826 x MAD, min_rel x |expected|)``
(the IQR / 1.349 stands in for the MAD's sigma in the first windows, before it exists).
"""

from __future__ import annotations

import polars as pl

from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

METHOD_ROLLING = "rolling"
METHOD_PROPHET = "prophet"
#: MAD to standard deviation for normally distributed data.
MAD_TO_SIGMA = 1.4826
#: Interquartile range to standard deviation for normally distributed data.
IQR_TO_SIGMA = 1.349


def rolling_baseline(series: pl.LazyFrame | pl.DataFrame, config: AnalyticsConfig) -> pl.LazyFrame:
    """Stage: long series frame -> series frame with a rolling band.

    Input: the output of :func:`analytics.series.window_series` (or ``request_series``).
    Output grain: unchanged (one row per series and window), with ``expected, lower, upper,
    method`` added. Invariants: row count unchanged; ``lower <= expected <= upper`` where
    ``expected`` is not null; ``expected`` is null for a series' first
    ``rolling_min_windows`` windows.
    """
    n, m = config.rolling_windows, config.rolling_min_windows
    value = pl.col(c.VALUE)
    frame = series.lazy().sort(c.SERIES, c.TS_NS)
    expected = value.rolling_median(n, min_samples=m).shift(1).over(c.SERIES)
    frame = frame.with_columns(expected.alias(c.EXPECTED))
    deviation = (value - pl.col(c.EXPECTED)).abs()
    mad_sigma = deviation.rolling_median(n, min_samples=m).shift(1).over(c.SERIES) * (
        MAD_TO_SIGMA)
    # The MAD needs m deviations from an expected value that itself needs m windows; until
    # then the interquartile range of the same windows gives the robust sigma, so a series
    # is judged after m windows, not 2m.
    iqr_sigma = ((value.rolling_quantile(0.75, "linear", n, min_samples=m)
                  - value.rolling_quantile(0.25, "linear", n, min_samples=m))
                 / IQR_TO_SIGMA).shift(1).over(c.SERIES)
    sigma = pl.coalesce(mad_sigma, iqr_sigma)
    # No sigma yet (too little history): no band, so no judgement, rather than a floor-only
    # band that would flag ordinary noise.
    half = pl.when(sigma.is_not_null()).then(pl.max_horizontal(
        sigma * config.band_k,
        pl.col(c.EXPECTED).abs() * config.band_min_rel,
    ))
    return frame.with_columns(half.alias("_half")).with_columns(
        (pl.col(c.EXPECTED) - pl.col("_half")).clip(lower_bound=0.0).alias(c.LOWER),
        (pl.col(c.EXPECTED) + pl.col("_half")).alias(c.UPPER),
        pl.lit(METHOD_ROLLING).alias(c.METHOD),
    ).drop("_half")


def to_baselines_table(frame: pl.LazyFrame | pl.DataFrame) -> pl.DataFrame:
    """The `baselines` table rows of a banded series frame (rows with a band only).

    Keeps ``metric``, the scope columns and ``value`` as extra columns so the dashboard can
    draw a series with its band without another join.
    """
    spec = t.table(t.BASELINES)
    extras = [c.METRIC, c.SERVICE_NAME, c.MODEL, c.HOST_NAME, c.LEVEL, c.VALUE]
    out = frame.lazy().filter(pl.col(c.EXPECTED).is_not_null()).select(
        *[pl.col(name).cast(dtype) for name, dtype in spec.columns.items()], *extras
    )
    return out.collect()
