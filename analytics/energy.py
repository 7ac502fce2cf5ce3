"""Energy analysis: J/token per model, host and GPU model over time; idle share; outliers.

Reads the pipeline's per-request energy (`request_energy`) joined to `requests`, and its
per-GPU window energy (`gpu_window_energy`: measured = attributed + idle joules).
"""

from __future__ import annotations

import polars as pl

from fleetlens.pipeline.schema import columns as c

NS = 1_000_000_000
#: A group is an outlier when its J/token is this many robust deviations above its peers'.
OUTLIER_Z = 3.0


def energy_key(requests: pl.DataFrame, request_energy: pl.DataFrame) -> list[str]:
    """Columns joining ``requests`` to ``request_energy``: the request's span (trace_id,
    span_id) when both have it, as request ids can repeat (vLLM's n > 1 choices share one);
    else request_id (request_energy written before it carried the span)."""
    span = [c.TRACE_ID, c.SPAN_ID]
    if all(col in requests.columns and col in request_energy.columns for col in span):
        return span
    return [c.REQUEST_ID]


def j_per_token(requests: pl.DataFrame, request_energy: pl.DataFrame, by: list[str],
                window_s: int | None = 3600) -> pl.DataFrame:
    """Stage: `requests` + `request_energy` -> J/token per ``by`` group (and time bucket).

    J/token = attributed request joules / output tokens, summed per group (a ratio of sums,
    so long answers weigh by their tokens). ``window_s=None`` gives one row per group.
    """
    missing = [col for col in by if col not in requests.columns]
    if missing:
        raise ValueError(f"requests have no column(s) {missing} to group J/token by")
    key = energy_key(requests, request_energy)
    joined = requests.select(*key, c.ARRIVAL_NS, c.OUTPUT_TOKENS, *by).join(
        request_energy.select(*key, c.ENERGY_J, c.ATTRIBUTION_COVERAGE), on=key, how="inner")
    keys = list(by)
    if window_s:
        step = window_s * NS
        joined = joined.with_columns((pl.col(c.ARRIVAL_NS) // step * step)
                                     .alias(c.WINDOW_START_NS))
        keys = [c.WINDOW_START_NS, *keys]
    return joined.group_by(keys).agg(
        pl.len().alias(c.REQUESTS),
        pl.col(c.ENERGY_J).sum(),
        pl.col(c.OUTPUT_TOKENS).sum(),
        (pl.col(c.ENERGY_J).sum() / pl.col(c.OUTPUT_TOKENS).sum().clip(lower_bound=1))
        .alias(c.J_PER_TOKEN),
        pl.col(c.ATTRIBUTION_COVERAGE).mean(),
    ).sort(keys)


def idle_share(gpu_window_energy: pl.DataFrame, by: str = c.HOST_NAME) -> pl.DataFrame:
    """Share of measured GPU joules spent idle (no request active), per host or GPU."""
    return gpu_window_energy.group_by(by).agg(
        pl.col(c.MEASURED_J).sum(), pl.col(c.ATTRIBUTED_J).sum(), pl.col(c.IDLE_J).sum(),
    ).with_columns(
        (pl.col(c.IDLE_J) / pl.col(c.MEASURED_J).clip(lower_bound=1e-9)).alias(c.IDLE_SHARE)
    ).sort(by)


def outliers(per_group: pl.DataFrame, group: str, peers: list[str]) -> pl.DataFrame:
    """Groups whose J/token stands out among peers (robust z-score above
    :data:`OUTLIER_Z`), e.g. hosts among the hosts serving the same model.

    Args:
        per_group: output of :func:`j_per_token` with ``window_s=None``.
        group: the column being judged (``host_name``).
        peers: columns defining who is compared with whom (``[model, gpu_model]``).
    """
    median = pl.col(c.J_PER_TOKEN).median().over(peers) if peers else pl.col(
        c.J_PER_TOKEN).median()
    frame = per_group.with_columns(median.alias("peer_median"))
    mad = ((pl.col(c.J_PER_TOKEN) - pl.col("peer_median")).abs().median().over(peers)
           if peers else (pl.col(c.J_PER_TOKEN) - pl.col("peer_median")).abs().median())
    frame = frame.with_columns(mad.alias("_mad")).with_columns(
        ((pl.col(c.J_PER_TOKEN) - pl.col("peer_median"))
         / (1.4826 * pl.max_horizontal(pl.col("_mad"), pl.col("peer_median") * 0.02)))
        .alias("z"))
    return frame.filter(pl.col("z") > OUTLIER_Z).drop("_mad").sort("z", descending=True).select(
        group, *[p for p in peers if p != group], c.J_PER_TOKEN, "peer_median", "z")
