"""Peer series: each engine instance against its siblings serving the same model, now.

A straggler (one slow, throttled or capped GPU among eight on a host) barely moves its host's
window percentiles, and a traffic burst moves every instance at once. Dividing an
instance's per-window latency by the median of all instances of the same (service, model)
in the same window cancels what the traffic does to everyone and keeps what is wrong with
this instance: the ratio sits near 1 and a straggler's rises. These ratio series are
baselined and detected like any other; they are host-level series (their scope is the
instance's host), named with the instance, so an incident they raise is scoped to the host
and attribution names the GPU.
"""

from __future__ import annotations

import polars as pl

from fleetlens.analytics.series import request_series, series_name
from fleetlens.pipeline.schema import columns as c

#: Suffix of a peer-ratio metric: ``tpot_p50_s`` -> ``tpot_p50_vs_peers``.
PEER_SUFFIX = "_vs_peers"
_GROUP = [c.METRIC, c.SERVICE_NAME, c.MODEL, c.TS_NS]
_DIMS = [c.SERVICE_NAME, c.MODEL, c.HOST_NAME, c.INSTANCE_ID]


def peer_metric(metric: str) -> str:
    """The peer-ratio metric name of a window latency metric (``tpot_p50_s`` ->
    ``tpot_p50_vs_peers``)."""
    return metric.removesuffix("_s") + PEER_SUFFIX


def is_peer_metric(metric: str) -> bool:
    """Whether ``metric`` names a peer-ratio series."""
    return metric.endswith(PEER_SUFFIX)


def peer_series(requests: pl.LazyFrame, window_s: int, metrics: list[str],
                min_requests: int, min_peers: int = 3) -> pl.LazyFrame | None:
    """Stage: `requests` -> per-instance peer-ratio series (None without instance ids).

    Input: `requests` with ``instance_id``. Output: the columns of
    :func:`analytics.series.request_series`, one row per (peer metric, instance, window):
    ``value`` is the instance's percentile over the median of the same percentile of the
    (service, model)'s instances in that window, ``requests`` the instance's requests.
    Only instances with ``min_requests`` requests in the window count, as values and as
    peers, and a window needs ``min_peers`` of them (a median of two is no peer group).
    """
    names = requests.collect_schema().names()
    if c.INSTANCE_ID not in names or not metrics:
        return None
    per_instance = request_series(
        requests.filter(pl.col(c.INSTANCE_ID).is_not_null() & (pl.col(c.INSTANCE_ID) != "")),
        _DIMS, window_s, metrics,
    ).filter(pl.col(c.REQUESTS) >= min_requests)
    peers = pl.col(c.VALUE).median().over(_GROUP)
    ratio = (
        per_instance.with_columns(peers.alias("_peers"), pl.len().over(_GROUP).alias("_n"))
        .filter((pl.col("_n") >= min_peers) & (pl.col("_peers") > 0))
        .with_columns(
            (pl.col(c.VALUE) / pl.col("_peers")).alias(c.VALUE),
            (pl.col(c.METRIC).str.strip_suffix("_s") + PEER_SUFFIX).alias(c.METRIC),
        )
    )
    # request_series named the series after the window metric; rename it after the ratio.
    instance = pl.col(c.SERIES).str.extract(r"instance_id=([^,}]*)", 1).alias(c.INSTANCE_ID)
    return ratio.with_columns(instance).with_columns(
        series_name(pl.col(c.METRIC), _DIMS).alias(c.SERIES),
    ).select(c.SERIES, c.METRIC, c.SERVICE_NAME, c.MODEL, c.HOST_NAME, c.LEVEL, c.TS_NS,
             c.VALUE, c.REQUESTS)
