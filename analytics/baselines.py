"""Rolling robust baselines: median and MAD over the previous N windows of every series.

Always on and cheap: one vectorised pass over all series with ``.over(series)``. The current
window is excluded from its own baseline (``shift(1)``) so a spike cannot raise the bar it is
judged against. The band is ``expected +- max(k x 1.4826 x MAD, min_rel x |expected|)``
(the IQR / 1.349 stands in for the MAD's sigma in the first windows, before it exists).

No blind warm-up (issue 30): a series with fewer than ``rolling_min_windows`` clean windows
but at least ``warmup_min_windows`` is judged against a warm-up band, the same statistics
over the few windows it has with a wider floor (``warmup_band_min_rel``): a fresh install or
a new service detects a surge in its first minutes, not after 20 of them.
"""

from __future__ import annotations

import polars as pl

from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.peers import PEER_SUFFIX
from fleetlens.analytics.series import LEVEL_HOST
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

METHOD_ROLLING = "rolling"
METHOD_PROPHET = "prophet"
#: MAD to standard deviation for normally distributed data.
MAD_TO_SIGMA = 1.4826
#: Interquartile range to standard deviation for normally distributed data.
IQR_TO_SIGMA = 1.349


#: Marks windows left out of the statistics (inside a detected incident); kept in the
#: banded frame so other baselines (Prophet) leave them out too.
EXCLUDED = "_excluded"
#: The upper bound from the spread alone (without the look-back's usual highs), kept so
#: detection can judge a window by it when demand explains a rise (analyse.py).
UPPER_SPREAD = "_upper_spread"


def rolling_baseline(series: pl.LazyFrame | pl.DataFrame, config: AnalyticsConfig,
                     exclude: pl.DataFrame | None = None) -> pl.LazyFrame:
    """Stage: long series frame -> series frame with a rolling band.

    Input: the output of :func:`analytics.series.window_series` (or ``request_series``);
    ``exclude``: optional ``(service_name, model, host_name, ts_ns)`` windows that must not
    feed any baseline of that scope (windows inside detected incidents, see
    :func:`analytics.detect.incident_windows`). Output grain: unchanged (one row per series
    and window), with ``expected, lower, upper, method`` and :data:`EXCLUDED` added.
    Invariants: row count unchanged; ``lower <= expected <= upper`` where ``expected`` is
    not null; ``expected`` is null until a series has ``warmup_min_windows`` earlier (not
    excluded) windows (``rolling_min_windows`` without a warm-up), and until it has
    ``rolling_min_windows`` the band is the warm-up band (its floor
    ``warmup_band_min_rel``); an excluded window is still judged against the band of the
    clean windows before it.
    """
    n, m = config.rolling_windows, config.rolling_min_windows
    # Warm-up statistics from w windows on (w = m: none), used only until a series has m.
    w = min(m, config.warmup_min_windows or m)
    # Row order is restored at the end (joins need not keep it).
    frame = series.lazy().sort(c.SERIES, c.TS_NS).with_row_index("_row")
    if exclude is not None and exclude.height:
        keys = [c.SERVICE_NAME, c.MODEL, c.HOST_NAME, c.TS_NS]
        marks = exclude.select(keys).unique().with_columns(pl.lit(True).alias(EXCLUDED))
        frame = frame.join(marks.lazy(), on=keys, how="left")
    else:
        frame = frame.with_columns(pl.lit(None, pl.Boolean).alias(EXCLUDED))
    frame = frame.with_columns(pl.col(EXCLUDED).fill_null(False))
    # Statistics over the clean windows only, each one *including* its own window: the band
    # of any window (clean or not) is then the statistics of the last clean window strictly
    # before it, so the current window never judges itself and an incident never widens
    # the band of what comes after it.
    value = pl.col(c.VALUE)
    clean = frame.filter(~pl.col(EXCLUDED)).sort(c.SERIES, c.TS_NS)
    median = value.rolling_median(n, min_samples=m).over(c.SERIES)
    clean = clean.with_columns(median.alias("_median"))
    deviation = (value - pl.col("_median").shift(1).over(c.SERIES)).abs()
    # The MAD needs m deviations from an expected value that itself needs m windows; until
    # then the interquartile range of the same windows gives the robust sigma, so a series
    # is judged after m windows, not 2m.
    iqr = ((value.rolling_quantile(0.75, "linear", n, min_samples=m)
            - value.rolling_quantile(0.25, "linear", n, min_samples=m)) / IQR_TO_SIGMA)
    stats = clean.select(
        c.SERIES, pl.col(c.TS_NS).alias("_stats_ts"), "_median",
        (deviation.rolling_median(n, min_samples=m).over(c.SERIES) * MAD_TO_SIGMA)
        .alias("_mad_sigma"),
        iqr.over(c.SERIES).alias("_iqr_sigma"),
        (value.rolling_quantile(config.band_quantile, "linear", n, min_samples=m)
         if config.band_quantile is not None else pl.lit(None, pl.Float64))
        .over(c.SERIES).alias("_high"),
    )
    if w < m:
        stats = stats.join(_warmup_stats(clean, w, m, _warmed(config)),
                           on=[c.SERIES, "_stats_ts"], how="left")
    else:
        stats = stats.with_columns(pl.lit(None, pl.Float64).alias("_warm_median"),
                                   pl.lit(None, pl.Float64).alias("_warm_sigma"))
    stats = stats.sort("_stats_ts")
    joined = frame.sort(c.TS_NS).join_asof(
        stats, left_on=c.TS_NS, right_on="_stats_ts", by=c.SERIES, strategy="backward",
        allow_exact_matches=False, check_sortedness=False,  # both sorted by ts just above
    ).sort("_row")
    sigma = pl.coalesce("_mad_sigma", "_iqr_sigma")
    # No sigma yet (too little history): no band, so no judgement, rather than a floor-only
    # band that would flag ordinary noise.
    mature = sigma.is_not_null() & pl.col("_median").is_not_null()
    # Before m windows, the warm-up statistics: the same band over fewer windows, its floor
    # wider (a few windows' median is a rougher estimate, and a fresh engine's caches warm).
    warm = ~mature & pl.col("_warm_median").is_not_null() & pl.col("_warm_sigma").is_not_null()
    joined = joined.with_columns(
        pl.when(warm).then("_warm_median").otherwise("_median").alias("_median"),
        # no usual high yet: a few windows cannot say what the series reaches regularly
        pl.when(~warm).then("_high").alias("_high"),
        pl.when(mature).then(pl.max_horizontal(
            sigma * config.band_k, pl.col("_median").abs() * config.band_min_rel))
        .when(warm).then(pl.max_horizontal(
            pl.col("_warm_sigma") * config.band_k,
            pl.col("_warm_median").abs() * config.warmup_band_min_rel))
        .alias("_half"),
    )
    half = pl.col("_half")
    # A value the series reached often in its look-back is no breach, however far from the
    # median: bursty (bimodal) series, e.g. a replayed trace's micro-bursts lifting a p99
    # every few minutes, get an upper bound above their own usual highs.
    usual_high = pl.col("_high") * (1 + config.band_min_rel)
    return joined.with_columns(
        pl.when(half.is_not_null()).then(pl.col("_median")).alias(c.EXPECTED),
        half.alias("_half"),
    ).with_columns(
        (pl.col(c.EXPECTED) - pl.col("_half")).clip(lower_bound=0.0).alias(c.LOWER),
        pl.max_horizontal(pl.col(c.EXPECTED) + pl.col("_half"),
                          pl.when(pl.col(c.EXPECTED).is_not_null()).then(usual_high))
        .alias(c.UPPER),
        pl.lit(METHOD_ROLLING).alias(c.METHOD),
        (pl.col(c.EXPECTED) + pl.col("_half")).alias(UPPER_SPREAD),
    ).drop("_half", "_row", "_stats_ts", "_median", "_mad_sigma", "_iqr_sigma", "_high",
           "_warm_median", "_warm_sigma")


def _warmed(config: AnalyticsConfig) -> pl.Expr:
    """Which series get a warm-up band: those of ``warmup_levels``, and with
    ``warmup_host_medians`` a host's medians (not its peer ratios)."""
    warmed = pl.col(c.LEVEL).is_in(list(config.warmup_levels))
    if config.warmup_host_medians:
        metric = pl.col(c.METRIC)
        warmed = warmed | ((pl.col(c.LEVEL) == LEVEL_HOST)
                           & metric.str.contains("_p50", literal=True)
                           & ~metric.str.ends_with(PEER_SUFFIX))
    return warmed


def _warmup_stats(clean: pl.LazyFrame, w: int, m: int, warmed: pl.Expr) -> pl.LazyFrame:
    """The warm-up statistics of each clean window of a ``warmed`` series with fewer than
    ``m`` (and at least ``w``) clean windows up to it: the median of them and its MAD as a
    sigma, ``(series, _stats_ts, _warm_median, _warm_sigma)``.

    The MAD about the windows' own median, not the IQR: over eight windows of which three
    are a surge the IQR already spans the surge and the band swallows it from its third
    window (no incident: three windows in a row are needed), the MAD does not until half
    are. Few rows a series (under ``m``), so each young window meets its earlier ones in a
    self-join rather than a rolling MAD.
    """
    young = (clean.filter(warmed)
             .select(c.SERIES, c.TS_NS, c.VALUE)
             .with_columns(pl.int_range(pl.len()).over(c.SERIES).alias("_i"))
             .filter(pl.col("_i") < m - 1))
    pairs = (young.select(c.SERIES, "_i", pl.col(c.TS_NS).alias("_stats_ts"))
             .join(young.select(c.SERIES, pl.col("_i").alias("_j"), c.VALUE), on=c.SERIES)
             .filter(pl.col("_j") <= pl.col("_i")))
    median = pl.col(c.VALUE).median().over(c.SERIES, "_i")
    return (pairs.with_columns(median.alias("_warm_median"))
            .group_by(c.SERIES, "_stats_ts")
            .agg(pl.col("_warm_median").first(),
                 ((pl.col(c.VALUE) - pl.col("_warm_median")).abs().median() * MAD_TO_SIGMA)
                 .alias("_warm_sigma"), pl.len().alias("_n"))
            .filter(pl.col("_n") >= w).drop("_n"))


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
