"""GPU signal series: the slowest busy GPU clock of each host, per window.

A throttle on one GPU of a host (a thermal slowdown, a lowered power limit) slows its
engine instance by 15-30% against its peers, under a band that must leave room for the
instance's usual swings, while the GPU's own SM clock fell 15-60% at the same moment. On
random seeds 7 and 11-20, 15 of the 46 incidents missed were such throttles. This series
gives detection the mechanism (analytics.detect.clock_corroborated_breaches): the effect
alone is within the noise, the clock alone hurts no one, both together are a throttle.

Only busy samples count (utilisation known and at least :data:`BUSY_UTIL`): an idle GPU
drops its clock by design, and a lull must not read as a throttle.
"""

from __future__ import annotations

import polars as pl

from fleetlens.analytics.series import LEVEL_HOST, series_name
from fleetlens.pipeline.schema import FLEET_WIDE
from fleetlens.pipeline.schema import columns as c

#: Metric name of the series: the lowest per-window mean SM clock among a host's busy GPUs.
GPU_CLOCK_MIN = "gpu_clock_min_mhz"
#: A sample counts when the GPU was at least this busy (``util_gpu`` is a 0..1 share).
BUSY_UTIL = 0.5
_SCOPE = [c.SERVICE_NAME, c.MODEL, c.HOST_NAME]


def gpu_clock_series(gpu_samples: pl.LazyFrame, windows: pl.LazyFrame,
                     window_s: int) -> pl.LazyFrame | None:
    """Stage: (`gpu_samples`, `windows`) -> one host-level series per (service, model, host).

    Input: `gpu_samples` (``sm_clock_mhz``, ``util_gpu``) and `windows` rows of
    ``window_s``. Output: the columns of :func:`analytics.series.window_series`, metric
    :data:`GPU_CLOCK_MIN`: for each window, the lowest mean SM clock among the host's busy
    GPUs, repeated for every (service, model) the host served in that window (``requests``
    theirs). None when the samples carry no clock.
    """
    names = gpu_samples.collect_schema().names()
    if c.SM_CLOCK_MHZ not in names or c.UTIL_GPU not in names:
        return None
    step = window_s * 1_000_000_000
    per_gpu = (
        gpu_samples.filter((pl.col(c.SM_CLOCK_MHZ) > 0) & (pl.col(c.UTIL_GPU) >= BUSY_UTIL))
        .group_by(c.HOST_NAME, c.GPU_UUID, (pl.col(c.TS_NS) // step * step).alias(c.TS_NS))
        .agg(pl.col(c.SM_CLOCK_MHZ).mean())
    )
    per_host = per_gpu.group_by(c.HOST_NAME, c.TS_NS).agg(
        pl.col(c.SM_CLOCK_MHZ).min().alias(c.VALUE))
    scopes = (windows.filter((pl.col(c.WINDOW_S) == window_s) & (pl.col(c.HOST_NAME) != FLEET_WIDE))
              .select(*_SCOPE, pl.col(c.WINDOW_START_NS).alias(c.TS_NS), c.REQUESTS))
    return scopes.join(per_host, on=[c.HOST_NAME, c.TS_NS], how="inner").with_columns(
        pl.lit(GPU_CLOCK_MIN).alias(c.METRIC),
        series_name(GPU_CLOCK_MIN, _SCOPE).alias(c.SERIES),
        pl.lit(LEVEL_HOST).alias(c.LEVEL),
        pl.col(c.VALUE).cast(pl.Float64),
    ).select(c.SERIES, c.METRIC, *_SCOPE, c.LEVEL, c.TS_NS, c.VALUE, c.REQUESTS)
