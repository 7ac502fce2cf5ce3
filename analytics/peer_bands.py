"""Borrowed bands: a young series judged against its established peers, or its service's SLOs.

No blind warm-up (issue 30 item 2): a new host or a new service has no band of its own for
its first ``warmup_min_windows`` windows (``rolling_min_windows`` for the series no warm-up
band covers), and a warm-up band over windows that are already an incident swallows it. A
series with no band of its own in a window borrows, for that window, the band of its
*peers*: the established series (a band, ``warmup_peer_min_windows`` windows) of the same
metric and level serving the same model on the same GPU model (another host of the service,
or another service of that model on those GPUs), whose band is built from what the peers
did at that very time. Its floor is the warm-up
floor (``warmup_band_min_rel``): a peer's level is only an estimate of a newcomer's. With no
peer, a latency SLO of the service (``analytics.slos``: "TTFT <= 1 s for 99%") is the upper
bound of the matching percentile series (``ttft_p99_s``): the one level the operator said
is wrong whatever the history.

Only windows without a band of their own are touched: a warm-up or mature band is never
replaced, so everything the rolling baseline judged is judged the same.
"""

from __future__ import annotations

import polars as pl

from fleetlens.analytics.baselines import UPPER_SPREAD
from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.peers import PEER_SUFFIX
from fleetlens.analytics.series import LEVEL_HOST, LEVEL_SERVICE
from fleetlens.analytics.slos.config import SloConfig
from fleetlens.pipeline.schema import FLEET_WIDE
from fleetlens.pipeline.schema import columns as c

#: GPU model key of a scope whose GPUs are unknown (peers only among the unknown).
UNKNOWN_GPU = "?"
_SCOPE = [c.SERVICE_NAME, c.MODEL, c.HOST_NAME]
_PEER_KEY = [c.METRIC, c.LEVEL, c.MODEL, c.GPU_MODEL, c.TS_NS]


def scope_gpus(series: pl.DataFrame, gpu_samples: pl.LazyFrame | pl.DataFrame | None
               ) -> pl.DataFrame:
    """``(service_name, model, host_name, gpu_model)`` of every host and service scope of
    ``series``: a host's GPU models in `gpu_samples`, a service's those of its hosts, sorted
    and joined by ``+`` (:data:`UNKNOWN_GPU` without samples)."""
    hosts = series.filter(pl.col(c.LEVEL) == LEVEL_HOST).select(_SCOPE).unique()
    known = None
    if gpu_samples is not None:
        samples = gpu_samples.lazy()
        if {c.HOST_NAME, c.GPU_MODEL} <= set(samples.collect_schema().names()):
            # distinct pairs first: a mode over every sample would read 2 days of 1 s rows
            known = (samples.filter(pl.col(c.GPU_MODEL).is_not_null())
                     .select(c.HOST_NAME, c.GPU_MODEL).unique()
                     .group_by(c.HOST_NAME)
                     .agg(pl.col(c.GPU_MODEL).sort().str.join("+")).collect())
    if known is None:
        known = pl.DataFrame(schema={c.HOST_NAME: pl.String, c.GPU_MODEL: pl.String})
    per_host = hosts.join(known, on=c.HOST_NAME, how="left").with_columns(
        pl.col(c.GPU_MODEL).fill_null(UNKNOWN_GPU))
    per_service = (per_host.group_by(c.SERVICE_NAME, c.MODEL)
                   .agg(pl.col(c.GPU_MODEL).str.split("+").explode().unique().sort()
                        .str.join("+"))
                   .with_columns(pl.lit(FLEET_WIDE).alias(c.HOST_NAME)))
    return pl.concat([per_host, per_service.select(per_host.columns)])


def slo_bounds(slos: SloConfig) -> pl.DataFrame:
    """``(service_name, metric, _slo)``: each latency SLO as the upper bound of the window
    percentile it states (TTFT <= 1 s for 99% -> ``ttft_p99_s`` <= 1 s)."""
    rows = [(svc.service, f"{slo.metric}_p{round(slo.objective * 100)}_s", slo.threshold_s)
            for svc in slos.services for slo in svc.latency]
    return pl.DataFrame(rows, schema={c.SERVICE_NAME: pl.String, c.METRIC: pl.String,
                                      "_slo": pl.Float64}, orient="row").unique(
        [c.SERVICE_NAME, c.METRIC])


def borrow_bands(banded: pl.DataFrame, config: AnalyticsConfig,
                 gpus: pl.DataFrame | None) -> pl.DataFrame:
    """Stage: banded series -> the same rows, a young window's missing band borrowed.

    Input: the output of :func:`analytics.baselines.rolling_baseline` (collected) and
    :func:`scope_gpus`. Output: row count, order and every band already there unchanged;
    a ``detect_metrics`` window of a host or service series with no ``expected`` gets its
    peers' band (the median of the ``expected``, ``upper`` and spread-only upper of the
    series of the same metric, level, model and GPU model with a band and at least
    ``warmup_peer_min_windows`` earlier windows, in that window; the half-width at least
    ``warmup_band_min_rel`` x expected), else the service's latency SLO as ``expected``
    and ``upper``. Nothing happens with ``warmup_peer_bands`` off or without ``gpus``.
    """
    if not config.warmup_peer_bands or gpus is None or banded.is_empty():
        return banded
    frame = banded.with_row_index("_row").join(
        gpus, on=_SCOPE, how="left").with_columns(
        (pl.col(c.TS_NS).rank("ordinal").over(c.SERIES) - 1).alias("_age"))
    eligible = (pl.col(c.METRIC).is_in(list(config.detect_metrics))
                & ~pl.col(c.METRIC).str.ends_with(PEER_SUFFIX)
                & pl.col(c.LEVEL).is_in([LEVEL_HOST, LEVEL_SERVICE])
                & pl.col(c.GPU_MODEL).is_not_null())
    mature = eligible & pl.col(c.EXPECTED).is_not_null() & (
        pl.col("_age") >= config.warmup_peer_min_windows)
    peers = (frame.filter(mature).group_by(_PEER_KEY)
             .agg(pl.col(c.EXPECTED).median().alias("_p_expected"),
                  pl.col(c.UPPER).median().alias("_p_upper"),
                  pl.col(UPPER_SPREAD).median().alias("_p_spread")))
    young = frame.filter(eligible & pl.col(c.EXPECTED).is_null()).join(
        peers, on=_PEER_KEY, how="left")
    if config.warmup_slo_bounds and config.slos.services:
        young = young.join(slo_bounds(config.slos), on=[c.SERVICE_NAME, c.METRIC],
                           how="left")
    else:
        young = young.with_columns(pl.lit(None, pl.Float64).alias("_slo"))
    floor = pl.col("_p_expected") * (1 + config.warmup_band_min_rel)
    peer = pl.col("_p_expected").is_not_null()
    borrowed = young.select(
        "_row",
        pl.when(peer).then("_p_expected").otherwise("_slo").alias("_b_expected"),
        pl.when(peer).then(pl.max_horizontal("_p_upper", floor))
        .otherwise("_slo").alias("_b_upper"),
        pl.when(peer).then(pl.max_horizontal("_p_spread", floor))
        .otherwise("_slo").alias("_b_spread"),
        pl.when(peer).then((2 * pl.col("_p_expected") - pl.max_horizontal("_p_upper", floor))
                           .clip(lower_bound=0.0))
        .when(pl.col("_slo").is_not_null()).then(0.0).alias("_b_lower"),
    ).filter(pl.col("_b_expected").is_not_null())
    if borrowed.is_empty():
        return banded
    out = banded.with_row_index("_row").join(borrowed, on="_row", how="left",
                                             maintain_order="left")
    return out.with_columns(
        pl.coalesce(c.EXPECTED, "_b_expected").alias(c.EXPECTED),
        pl.coalesce(c.LOWER, "_b_lower").alias(c.LOWER),
        pl.coalesce(c.UPPER, "_b_upper").alias(c.UPPER),
        pl.coalesce(UPPER_SPREAD, "_b_spread").alias(UPPER_SPREAD),
    ).drop("_row", "_b_expected", "_b_lower", "_b_upper", "_b_spread")
