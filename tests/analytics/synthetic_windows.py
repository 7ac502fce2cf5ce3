"""`windows` rows for the synthetic fleet (a compact stand-in for the pipeline's stage).

Requests are windowed by arrival; per-host rows plus fleet-wide rows (``host_name='*'``) per
(service, model). GPU power/energy and engine KV/prefix/preemption figures are joined per
host and window.
"""

from __future__ import annotations

import polars as pl

from fleetlens.pipeline.schema import FLEET_WIDE, conform, validate
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

NS = 1_000_000_000
_LATENCY = {
    "ttft": c.TTFT_S, "tpot": c.TPOT_S, "e2e": c.E2E_S, "queue": c.QUEUE_S,
    "prefill": c.PREFILL_S, "decode": c.DECODE_S,
}


def _request_aggs(window_s: int) -> list[pl.Expr]:
    aggs = [
        pl.len().cast(pl.Int64).alias(c.REQUESTS),
        (pl.len() / window_s).alias(c.RPS),
        pl.col(c.INPUT_TOKENS).sum().alias(c.INPUT_TOKENS),
        pl.col(c.OUTPUT_TOKENS).sum().alias(c.OUTPUT_TOKENS),
        (pl.col(c.OUTPUT_TOKENS).sum() / window_s).alias(c.OUTPUT_TOK_S),
        pl.col(c.IS_ERROR).cast(pl.Float64).mean().alias(c.ERROR_RATE),
    ]
    for metric, column in _LATENCY.items():
        for suffix, q in c.PERCENTILES:
            aggs.append(pl.col(column).quantile(q, "linear")
                        .alias(c.percentile_column(metric, suffix)))
    return aggs


def windows_from(requests: pl.DataFrame, engine: pl.DataFrame, gpus: pl.DataFrame,
                 window_s: int) -> pl.DataFrame:
    """Stage: `requests` + `engine_samples` + `gpu_samples` -> `windows`.

    Grain: one row per (window_start_ns, service, model, host) and per (window_start_ns,
    service, model) with host ``'*'``. Invariant: ``requests`` sums over hosts equal the
    fleet-wide row.
    """
    step = window_s * NS
    start = pl.col(c.ARRIVAL_NS) // step * step
    keyed = requests.with_columns(start.alias(c.WINDOW_START_NS))
    keys = [c.WINDOW_START_NS, c.SERVICE_NAME, c.MODEL]
    per_host = keyed.group_by([*keys, c.HOST_NAME]).agg(_request_aggs(window_s))
    fleet = keyed.group_by(keys).agg(_request_aggs(window_s)).with_columns(
        pl.lit(FLEET_WIDE).alias(c.HOST_NAME))

    gw = gpus.with_columns((pl.col(c.TS_NS) // step * step).alias(c.WINDOW_START_NS))
    gpu_host = (
        gw.sort(c.TS_NS)
        .group_by([c.WINDOW_START_NS, c.HOST_NAME, c.GPU_UUID])
        .agg(pl.col(c.POWER_W).mean(), (pl.col(c.ENERGY_J).last() - pl.col(c.ENERGY_J).first())
                                       .alias(c.ENERGY_J))
        .group_by([c.WINDOW_START_NS, c.HOST_NAME])
        .agg(pl.col(c.POWER_W).sum(), pl.col(c.ENERGY_J).sum())
    )
    ew = engine.sort(c.TS_NS).with_columns(
        (pl.col(c.TS_NS) // step * step).alias(c.WINDOW_START_NS))
    eng_inst = ew.group_by([c.WINDOW_START_NS, c.HOST_NAME, c.INSTANCE_ID]).agg(
        pl.col(c.KV_CACHE_USAGE).mean().alias(c.KV_CACHE_USAGE_MEAN),
        pl.col(c.KV_CACHE_USAGE).max().alias(c.KV_CACHE_USAGE_MAX),
        (pl.col(c.PREEMPTIONS_TOTAL).max() - pl.col(c.PREEMPTIONS_TOTAL).min())
        .alias(c.PREEMPTIONS),
        (pl.col(c.PREFIX_CACHE_HITS_TOTAL).max() - pl.col(c.PREFIX_CACHE_HITS_TOTAL).min())
        .alias("_hits"),
        (pl.col(c.PREFIX_CACHE_QUERIES_TOTAL).max()
         - pl.col(c.PREFIX_CACHE_QUERIES_TOTAL).min()).alias("_queries"),
    )

    def engine_for(group: list[str]) -> pl.DataFrame:
        return eng_inst.group_by(group).agg(
            pl.col(c.KV_CACHE_USAGE_MEAN).mean(), pl.col(c.KV_CACHE_USAGE_MAX).max(),
            pl.col(c.PREEMPTIONS).sum(),
            (pl.col("_hits").sum() / pl.col("_queries").sum()).alias(c.PREFIX_HIT_RATE),
        )

    per_host = per_host.join(gpu_host, on=[c.WINDOW_START_NS, c.HOST_NAME], how="left").join(
        engine_for([c.WINDOW_START_NS, c.HOST_NAME]), on=[c.WINDOW_START_NS, c.HOST_NAME],
        how="left")
    fleet_gpu = gpu_host.group_by(c.WINDOW_START_NS).agg(pl.col(c.POWER_W).sum(),
                                                          pl.col(c.ENERGY_J).sum())
    fleet = fleet.join(fleet_gpu, on=c.WINDOW_START_NS, how="left").join(
        engine_for([c.WINDOW_START_NS]), on=c.WINDOW_START_NS, how="left")
    out = pl.concat([per_host, fleet.select(per_host.columns)]).with_columns(
        pl.lit(window_s, pl.Int64).alias(c.WINDOW_S),
        (pl.col(c.ENERGY_J) / pl.col(c.OUTPUT_TOKENS)).alias(c.J_PER_TOKEN),
    )
    return validate(conform(out, t.WINDOWS), t.WINDOWS).sort(c.WINDOW_START_NS, c.HOST_NAME)
