"""Detectors: band breaches for k consecutive windows, corroborated rises, and SLO rules.

Each turns a banded series frame (:func:`analytics.baselines.rolling_baseline`) into
*anomalies*: one row per run of consecutive bad windows of one series. Merging anomalies
across levels into incidents is :mod:`analytics.merge`.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.gpu_signals import GPU_CLOCK_MIN
from fleetlens.analytics.slo import SloRule, parse_rule
from fleetlens.pipeline.schema import columns as c

DETECTOR_BAND = "band"
#: Detector of a strong breach, reported from its first window (``strong_ratio``).
DETECTOR_STRONG = "band:strong"
#: Detector name of a corroborated rise: ``corroborated:<signal metric>``.
DETECTOR_CORROBORATED = "corroborated"
#: Detector of a latency rise found with the GPU clock's drop (clock_corroborated_breaches).
DETECTOR_CLOCK = f"{DETECTOR_CORROBORATED}:{GPU_CLOCK_MIN}"
_RUN = "_run"
_BAD = "_bad"
_SCOPE = [c.SERIES, c.METRIC, c.SERVICE_NAME, c.MODEL, c.HOST_NAME, c.LEVEL]
#: Columns of an anomalies frame.
ANOMALY_COLUMNS = [*_SCOPE, c.START_NS, c.END_NS, c.PEAK, c.EXPECTED, c.DETECTED_NS,
                   c.DETECTOR, c.REQUESTS]


def _runs(frame: pl.LazyFrame, bad: pl.Expr, min_len: int, window_s: int,
          detector: str) -> pl.LazyFrame:
    """Runs of at least ``min_len`` consecutive windows (no gap) where ``bad`` holds."""
    step = window_s * 1_000_000_000
    flagged = frame.sort(c.SERIES, c.TS_NS).with_columns(bad.fill_null(False).alias(_BAD))
    boundary = (
        (pl.col(_BAD) != pl.col(_BAD).shift(1)).fill_null(True)
        | ((pl.col(c.TS_NS) - pl.col(c.TS_NS).shift(1)) != step).fill_null(True)
    )
    flagged = flagged.with_columns(boundary.cum_sum().over(c.SERIES).alias(_RUN))
    runs = (
        flagged.filter(pl.col(_BAD))
        .group_by([*_SCOPE, _RUN])
        .agg(
            pl.col(c.TS_NS).min().alias(c.START_NS),
            (pl.col(c.TS_NS).max() + step).alias(c.END_NS),
            pl.col(c.VALUE).max().alias(c.PEAK),
            pl.col(c.EXPECTED).sort_by(c.VALUE).last().alias(c.EXPECTED),
            # The run is reported once its min_len-th window has closed.
            (pl.col(c.TS_NS).sort().get(min_len - 1, null_on_oob=True) + step)
            .alias(c.DETECTED_NS),
            pl.col(c.REQUESTS).sum().alias(c.REQUESTS),
            pl.len().alias("_len"),
        )
        .filter(pl.col("_len") >= min_len)
        .with_columns(pl.lit(detector).alias(c.DETECTOR))
    )
    return runs.select(ANOMALY_COLUMNS)


def band_breaches(banded: pl.LazyFrame | pl.DataFrame, config: AnalyticsConfig,
                  window_s: int) -> pl.LazyFrame:
    """Stage: banded series -> anomalies where the value stays above the band.

    Input: banded series frame. Output grain: one row per run of at least
    ``config.consecutive`` consecutive windows above ``upper`` for a series in
    ``config.detect_metrics``, judged only where the window has ``min_requests`` requests
    (``min_requests_median`` for p50 series).
    Latency only gets worse upwards, so only the upper band counts.

    A strong breach of a ``strong_metrics`` series (at least ``strong_ratio`` x its upper
    band, and ``strong_min_rise`` x its expected value) is also a run from its first window
    (detector ``band:strong``): a queue that made the median TTFT x10 in a window needs no
    two more windows to be believed, and live each window costs its length in delay.
    """
    frame = banded.lazy().filter(pl.col(c.METRIC).is_in(list(config.detect_metrics)))
    # A median is steady on fewer requests than a tail: p50 series are judged from
    # min_requests_median requests (an instance serving a dozen requests a minute).
    needed = (pl.when(pl.col(c.METRIC).str.contains("_p50", literal=True))
              .then(config.min_requests_median).otherwise(config.min_requests))
    bad = (
        (pl.col(c.REQUESTS) >= needed)
        & pl.col(c.UPPER).is_not_null()
        & (pl.col(c.VALUE) > pl.col(c.UPPER))
    )
    runs = _runs(frame, bad, config.consecutive, window_s, DETECTOR_BAND)
    if config.strong_ratio is None or not config.strong_metrics or config.consecutive <= 1:
        return runs
    strong = (bad & pl.col(c.METRIC).is_in(list(config.strong_metrics))
              & (pl.col(c.VALUE) >= pl.col(c.UPPER) * config.strong_ratio)
              & (pl.col(c.VALUE) >= pl.col(c.EXPECTED) * config.strong_min_rise))
    return pl.concat([runs, _runs(frame, strong, 1, window_s, DETECTOR_STRONG)])


def corroborated_breaches(banded: pl.LazyFrame | pl.DataFrame, config: AnalyticsConfig,
                          window_s: int) -> pl.LazyFrame:
    """Stage: banded series -> anomalies where a latency rose while its mechanism fell.

    Input: banded series frame. Output grain: one row per run of at least
    ``config.consecutive`` consecutive windows in which a ``LATENCY:SIGNAL`` pair of
    ``config.corroborated_metrics`` holds on the same scope (service, model, host): the
    latency is at least ``corroborated_min_ratio`` x its expected value (judged from
    ``min_requests_median`` requests) while the signal fell to at most
    ``corroborated_signal_drop`` x its own expected value, and by at least
    ``corroborated_min_drop``. Detector ``corroborated:<signal>``.

    Why: a host whose prefix cache was emptied (hit rate 0.13-0.53 -> 0) serves TTFT p50
    x1.2-1.5, under a band whose floor is the host's usual replayed-trace highs (15 of the
    39 incidents the random suite missed on seeds 7, 11-16). Either fact alone is weak: the
    rise is within the host's usual swings and a hit rate that fell alone hurts no one.
    Together they are the mechanism and its effect.
    """
    parts = [_corroborated(banded, *pair.split(":", 1), config.corroborated_min_ratio,
                           config.corroborated_signal_drop, config.corroborated_min_drop,
                           config, window_s)
             for pair in config.corroborated_metrics]
    return pl.concat(parts) if parts else empty_anomalies().lazy()


def clock_corroborated_breaches(banded: pl.LazyFrame | pl.DataFrame, config: AnalyticsConfig,
                                window_s: int) -> pl.LazyFrame:
    """Stage: banded series -> anomalies where a latency rose while a GPU clock fell.

    Input: banded series frame with the :data:`analytics.gpu_signals.GPU_CLOCK_MIN`
    series. Output grain: one row per run of at least ``config.consecutive`` windows in
    which a ``clock_corroborated_metrics`` latency of a (service, model, host) scope (an
    instance's peer ratio included) is at least ``clock_corroborated_min_ratio`` x its
    expected value while the host's slowest busy GPU clock is at most
    ``clock_corroborated_drop`` x its own expected value. Detector
    ``corroborated:gpu_clock_min_mhz``.

    Why: a throttle on one GPU of a host (thermal, a lowered power limit) moved its
    instance x1.15-1.3 against its peers, just under a band that leaves room for the
    instance's usual swings, while its clock fell 15-60% (random seeds 7 and 11-20: 15 of
    the 46 incidents missed).
    """
    parts = [_corroborated(banded, latency, GPU_CLOCK_MIN,
                           config.clock_corroborated_min_ratio,
                           config.clock_corroborated_drop, 0.0, config, window_s)
             for latency in config.clock_corroborated_metrics]
    return pl.concat(parts) if parts else empty_anomalies().lazy()


def _corroborated(banded: pl.LazyFrame | pl.DataFrame, latency: str, signal: str,
                  min_ratio: float, drop: float, min_drop: float, config: AnalyticsConfig,
                  window_s: int) -> pl.LazyFrame:
    """Runs where ``latency`` >= ``min_ratio`` x expected while ``signal`` of the same
    (service, model, host) scope <= ``drop`` x its expected value and ``min_drop`` under it."""
    frame = banded.lazy()
    keys = [c.SERVICE_NAME, c.MODEL, c.HOST_NAME, c.LEVEL, c.TS_NS]
    fell = (frame.filter(pl.col(c.METRIC) == signal)
            .select(*keys, pl.col(c.VALUE).alias("_signal"),
                    pl.col(c.EXPECTED).alias("_signal_expected")))
    bad = (
        (pl.col(c.REQUESTS) >= config.min_requests_median)
        & (pl.col(c.EXPECTED) > 0)
        & (pl.col(c.VALUE) >= pl.col(c.EXPECTED) * min_ratio)
        & (pl.col("_signal") <= pl.col("_signal_expected") * drop)
        & (pl.col("_signal_expected") - pl.col("_signal") >= min_drop)
    )
    rose = frame.filter(pl.col(c.METRIC) == latency).join(fell, on=keys, how="inner")
    return _runs(rose, bad, config.consecutive, window_s, f"{DETECTOR_CORROBORATED}:{signal}")


def slo_breaches(banded: pl.LazyFrame | pl.DataFrame, rules: list[SloRule] | tuple[str, ...],
                 window_s: int, min_requests: int = 1) -> pl.LazyFrame:
    """Stage: series -> anomalies where an SLO rule is broken for its duration.

    Input: a series frame (band columns optional). Output: anomalies with detector
    ``slo:<rule text>``; ``expected`` is the rule's threshold.
    """
    parsed = [parse_rule(r) if isinstance(r, str) else r for r in rules]
    frame = banded.lazy()
    if c.EXPECTED not in frame.collect_schema().names():
        frame = frame.with_columns(pl.lit(None, pl.Float64).alias(c.EXPECTED))
    parts = []
    for rule in parsed:
        over = (pl.col(c.VALUE) >= rule.threshold_s) if rule.inclusive else (
            pl.col(c.VALUE) > rule.threshold_s)
        bad = (pl.col(c.REQUESTS) >= min_requests) & over
        scoped = frame.filter(pl.col(c.METRIC) == rule.column).with_columns(
            pl.lit(rule.threshold_s).alias(c.EXPECTED))
        parts.append(_runs(scoped, bad, rule.windows_needed(window_s), window_s,
                           f"slo:{rule.text}"))
    if not parts:
        return empty_anomalies().lazy()
    return pl.concat(parts)


def empty_anomalies() -> pl.DataFrame:
    """An anomalies frame with no rows."""
    schema = {name: pl.String for name in _SCOPE}
    schema.update({c.START_NS: pl.Int64, c.END_NS: pl.Int64, c.PEAK: pl.Float64,
                   c.EXPECTED: pl.Float64, c.DETECTED_NS: pl.Int64, c.DETECTOR: pl.String,
                   c.REQUESTS: pl.Int64})
    return pl.DataFrame(schema=schema)


def detect(banded: pl.LazyFrame | pl.DataFrame, config: AnalyticsConfig,
           window_s: int) -> pl.DataFrame:
    """All anomalies of the detectors, collected and sorted by start."""
    parts = [band_breaches(banded, config, window_s)]
    if config.corroborated_metrics:
        parts.append(corroborated_breaches(banded, config, window_s))
    if config.clock_corroborated_metrics:
        parts.append(clock_corroborated_breaches(banded, config, window_s))
    if config.slo_rules:
        parts.append(slo_breaches(banded, config.slo_rules, window_s, config.min_requests))
    out = pl.concat(parts).collect()
    return out.with_columns(pl.col(c.REQUESTS).cast(pl.Int64)).sort(c.START_NS, c.SERIES)


def explain_detector(detector: str, config: AnalyticsConfig) -> str:
    """How an incident whose ``detector`` column reads ``detector`` (comma-joined names)
    was found, in one sentence per detector: what the dashboard shows under its chart."""
    said = []
    for name in filter(None, (detector or "").split(",")):
        if name == DETECTOR_BAND:
            said.append(f"Above the upper band for {config.consecutive} windows in a row.")
        elif name == DETECTOR_STRONG:
            said.append(f"At least {config.strong_ratio:g}x its upper band in a window: "
                        "reported from that window, without waiting for "
                        f"{config.consecutive} in a row.")
        elif name == DETECTOR_CLOCK:
            said.append(
                f"At least {config.clock_corroborated_min_ratio:g}x its expected value for "
                f"{config.consecutive} windows in a row while the slowest busy GPU clock of "
                f"the host fell to {config.clock_corroborated_drop:.0%} of its expected "
                "value or less: a throttle found under the band, by the mechanism and its "
                "effect together.")
        elif name.startswith(f"{DETECTOR_CORROBORATED}:"):
            said.append(
                f"At least {config.corroborated_min_ratio:g}x its expected value for "
                f"{config.consecutive} windows in a row while {name.split(':', 1)[1]} of "
                f"the same scope fell to {config.corroborated_signal_drop:.0%} of its "
                "expected value or less: found under the band, by the mechanism and its "
                "effect together.")
        elif name.startswith("slo:"):
            said.append(f"SLO rule broken: {name.removeprefix('slo:')}.")
        else:
            said.append(f"Detector {name}.")
    return " ".join(said)


def incident_windows(anomalies: pl.DataFrame, banded: pl.DataFrame, config: AnalyticsConfig,
                     window_s: int) -> pl.DataFrame:
    """Windows that must not feed the baselines: those inside detected incidents.

    Input: anomalies of :func:`detect` and the banded frame they came from. Output: one row
    per ``(service_name, model, host_name, ts_ns)`` window of an incident of that scope
    (every metric of the scope is affected, not only the one that breached).

    An incident lasts from its start until its series is back under the band it left for
    ``consecutive`` windows in a row: a breach that ended only because the band widened is
    still an incident. A series that is not back within ``rolling_windows`` windows has a
    new normal (a level shift), not an incident: its windows stay in, or the old band, and
    the breach, would last for ever.
    """
    keys = [c.SERVICE_NAME, c.MODEL, c.HOST_NAME]
    empty = pl.DataFrame(schema={**{k: pl.String for k in keys}, c.TS_NS: pl.Int64})
    if anomalies.is_empty():
        return empty
    step = window_s * 1_000_000_000
    runs = anomalies.select(c.SERIES, *keys, c.START_NS).unique().sort(c.SERIES, c.START_NS)
    values = (banded.filter(pl.col(c.SERIES).is_in(runs[c.SERIES].unique().implode()))
              .select(c.SERIES, c.TS_NS, c.VALUE, c.UPPER).sort(c.SERIES, c.TS_NS))
    by_series = {key[0]: frame for key, frame in values.partition_by(
        c.SERIES, as_dict=True, maintain_order=True).items()}
    spans: list[tuple[str, str, str, int, int]] = []
    for run in runs.iter_rows(named=True):
        frame = by_series[run[c.SERIES]]
        ts = frame[c.TS_NS].to_numpy()
        i0 = int(np.searchsorted(ts, run[c.START_NS]))
        upper0 = frame[c.UPPER][i0]
        if upper0 is None:
            continue
        end = _recovery(ts[i0:], frame[c.VALUE].to_numpy()[i0:] <= upper0, step,
                        config.consecutive, config.rolling_windows)
        if end is not None:
            spans.append((run[c.SERVICE_NAME], run[c.MODEL], run[c.HOST_NAME],
                          run[c.START_NS], end))
    if not spans:
        return empty
    return (
        pl.DataFrame(spans, schema=[*keys, c.START_NS, c.END_NS], orient="row")
        .with_columns(pl.int_ranges(c.START_NS, c.END_NS, step).alias(c.TS_NS))
        .explode(c.TS_NS).drop_nulls(c.TS_NS)
        .select(*keys, pl.col(c.TS_NS).cast(pl.Int64)).unique().sort(*keys, c.TS_NS)
    )


def _recovery(ts: np.ndarray, ok: np.ndarray, step: int, consecutive: int,
              horizon: int) -> int | None:
    """End (exclusive) of an incident starting at ``ts[0]``: the first window of
    ``consecutive`` back-under-the-band windows in a row within ``horizon`` windows; the end
    of the data if it ends first; ``None`` (a level shift) when it never comes back."""
    limit = ts[0] + horizon * step
    streak = 0
    for k in range(len(ts)):
        if ts[k] >= limit:
            return None
        streak = streak + 1 if ok[k] else 0
        if streak == consecutive:
            return int(ts[k - consecutive + 1])
    return int(ts[-1]) + step
