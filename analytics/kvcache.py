"""KV-cache analysis: usage and headroom, preemption episodes, prefix hit rate and its drops,
usage versus queue time and TTFT, and capacity.

Capacity: what vLLM reports (``vllm:cache_config_info``: num_gpu_blocks x block_size, the
engine_samples column ``kv_capacity_tokens``) wherever it does; else estimated from the model
shape: KV bytes per token = 2 x layers x kv_heads x head_dim x bytes per value; the cache gets
``gpu_memory_utilization`` (vLLM's default 0.9) of the GPUs' memory minus the weights, split
over the tensor-parallel GPUs.
"""

from __future__ import annotations

import polars as pl

from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.hardware import memory_gb, model_shape
from fleetlens.pipeline.samples import counter_increase
from fleetlens.pipeline.schema import columns as c

NS = 1_000_000_000
GPU_MEMORY_UTILIZATION = 0.9
_QUEUE_P90 = c.percentile_column("queue", "p90")
_TTFT_P90 = c.percentile_column("ttft", "p90")
_REPORTED = "_reported_capacity"
#: ``kv_capacity_source``: where ``kv_capacity_tokens`` comes from.
SOURCE_VLLM, SOURCE_ESTIMATE = "vllm", "model_shape"
KV_CAPACITY_SOURCE = "kv_capacity_source"


def _counter_delta(column: str) -> pl.Expr:
    # The pipeline's one definition of a counter's increase (a restart counts the new value,
    # as Prometheus' increase() does); rows must be sorted by time within an instance.
    return counter_increase(pl.col(column), [c.INSTANCE_ID]).fill_null(0)


def kv_summary(engine: pl.DataFrame, instance_gpus: pl.DataFrame | None = None,
               gpu_model: dict[str, str] | None = None,
               config: AnalyticsConfig | None = None) -> pl.DataFrame:
    """Stage: `engine_samples` -> one row per instance.

    Columns: host, instance, model, KV usage mean/p95/max, ``kv_headroom`` (1 - p95),
    preemptions and preemptions per minute, token-level prefix hit rate, and when the model
    shape and GPU are known, the KV capacity in tokens (``kv_capacity_tokens``): vLLM's own
    figure where the engine reports it, else the estimate (``kv_capacity_source`` says which).
    """
    config = config or AnalyticsConfig()
    # Engine samples written before the agent forwarded vllm:cache_config_info lack the column.
    reported = (pl.col(c.KV_CAPACITY_TOKENS).max() if c.KV_CAPACITY_TOKENS in engine.columns
                else pl.lit(None, pl.Float64)).alias(_REPORTED)
    frame = engine.sort(c.INSTANCE_ID, c.TS_NS).with_columns(
        _counter_delta(c.PREEMPTIONS_TOTAL).alias("_pre"),
        _counter_delta(c.PREFIX_CACHE_HITS_TOTAL).alias("_hits"),
        _counter_delta(c.PREFIX_CACHE_QUERIES_TOTAL).alias("_queries"),
    )
    out = frame.group_by(c.HOST_NAME, c.INSTANCE_ID, c.MODEL).agg(
        pl.col(c.KV_CACHE_USAGE).mean().alias("kv_usage_mean"),
        pl.col(c.KV_CACHE_USAGE).quantile(0.95, "linear").alias("kv_usage_p95"),
        pl.col(c.KV_CACHE_USAGE).max().alias("kv_usage_max"),
        pl.col("_pre").sum().alias(c.PREEMPTIONS),
        (pl.col("_pre").sum() / ((pl.col(c.TS_NS).max() - pl.col(c.TS_NS).min()) / (60 * NS))
         .clip(lower_bound=1e-9)).alias("preemptions_per_min"),
        (pl.col("_hits").sum() / pl.col("_queries").sum().clip(lower_bound=1))
        .alias(c.PREFIX_HIT_RATE),
        reported,
    ).with_columns((1 - pl.col("kv_usage_p95")).alias(c.KV_HEADROOM))
    tp = (instance_gpus.filter(pl.col(c.GPU_UUID) != "").group_by(c.INSTANCE_ID)
          .agg(pl.col(c.GPU_UUID).n_unique().alias("tp"))
          if instance_gpus is not None and instance_gpus.height else None)
    if tp is not None:
        out = out.join(tp, on=c.INSTANCE_ID, how="left")
    else:
        out = out.with_columns(pl.lit(None, pl.UInt32).alias("tp"))
    capacity, source = [], []
    for row in out.iter_rows(named=True):
        tokens = row[_REPORTED]
        if tokens is not None:  # measured by vLLM: no model table or GPU guess needed
            capacity.append(float(tokens))
            source.append(SOURCE_VLLM)
            continue
        shape = model_shape(row[c.MODEL] or "", config)
        mem = memory_gb((gpu_model or {}).get(row[c.HOST_NAME], ""))
        if shape and mem:
            gpus = row["tp"] or 1
            free = gpus * mem * 1e9 * GPU_MEMORY_UTILIZATION - shape.weight_bytes
            tokens = max(free, 0) / shape.kv_bytes_per_token
        capacity.append(tokens)
        source.append(SOURCE_ESTIMATE if tokens is not None else None)
    return out.drop(_REPORTED).with_columns(
        pl.Series(c.KV_CAPACITY_TOKENS, capacity, dtype=pl.Float64),
        pl.Series(KV_CAPACITY_SOURCE, source, dtype=pl.String),
    ).sort(c.HOST_NAME, c.INSTANCE_ID)


def preemption_episodes(engine: pl.DataFrame, gap_s: float = 60.0) -> pl.DataFrame:
    """Runs of preemptions per instance: samples with new preemptions closer than ``gap_s``
    form one episode (start, end, preemptions, peak KV usage)."""
    frame = engine.sort(c.INSTANCE_ID, c.TS_NS).with_columns(
        _counter_delta(c.PREEMPTIONS_TOTAL).alias("_pre")).filter(pl.col("_pre") > 0)
    if frame.is_empty():
        return pl.DataFrame(schema={c.HOST_NAME: pl.String, c.INSTANCE_ID: pl.String,
                                    c.START_NS: pl.Int64, c.END_NS: pl.Int64,
                                    c.PREEMPTIONS: pl.Float64, "kv_usage_max": pl.Float64})
    gap = int(gap_s * NS)
    frame = frame.with_columns(
        ((pl.col(c.TS_NS).diff() > gap).fill_null(True).cum_sum().over(c.INSTANCE_ID))
        .alias("_episode"))
    return frame.group_by(c.HOST_NAME, c.INSTANCE_ID, "_episode").agg(
        pl.col(c.TS_NS).min().alias(c.START_NS), pl.col(c.TS_NS).max().alias(c.END_NS),
        pl.col("_pre").sum().alias(c.PREEMPTIONS),
        pl.col(c.KV_CACHE_USAGE).max().alias("kv_usage_max"),
    ).drop("_episode").sort(c.START_NS, c.INSTANCE_ID)


def prefix_hit_drops(engine: pl.DataFrame, window_s: int = 60, drop: float = 0.2,
                     lookback: int = 30) -> pl.DataFrame:
    """Token-level prefix hit rate per instance and window, flagged where it falls more than
    ``drop`` below its rolling median of the previous ``lookback`` windows."""
    step = window_s * NS
    rate = (engine.sort(c.INSTANCE_ID, c.TS_NS)
            .with_columns(_counter_delta(c.PREFIX_CACHE_HITS_TOTAL).alias("_h"),
                          _counter_delta(c.PREFIX_CACHE_QUERIES_TOTAL).alias("_q"),
                          (pl.col(c.TS_NS) // step * step).alias(c.WINDOW_START_NS))
            .group_by(c.HOST_NAME, c.INSTANCE_ID, c.WINDOW_START_NS)
            .agg((pl.col("_h").sum() / pl.col("_q").sum()).alias(c.PREFIX_HIT_RATE),
                 pl.col("_q").sum().alias("prefix_queries"))
            .sort(c.INSTANCE_ID, c.WINDOW_START_NS))
    usual = (pl.col(c.PREFIX_HIT_RATE).rolling_median(lookback, min_samples=5).shift(1)
             .over(c.INSTANCE_ID))
    return rate.with_columns(usual.alias("usual_hit_rate")).with_columns(
        (pl.col("usual_hit_rate") - pl.col(c.PREFIX_HIT_RATE) > drop).fill_null(False)
        .alias("drop"))


def usage_vs_latency(engine: pl.DataFrame, requests: pl.DataFrame,
                     window_s: int = 60) -> pl.DataFrame:
    """Per instance: KV usage against queue time and TTFT per window, with the Pearson
    correlation of usage with each (how much a full cache costs in waiting)."""
    step = window_s * NS
    usage = engine.with_columns((pl.col(c.TS_NS) // step * step).alias(c.WINDOW_START_NS)
                                ).group_by(c.INSTANCE_ID, c.WINDOW_START_NS).agg(
        pl.col(c.KV_CACHE_USAGE).mean().alias(c.KV_CACHE_USAGE_MEAN))
    latency = requests.with_columns((pl.col(c.ARRIVAL_NS) // step * step)
                                    .alias(c.WINDOW_START_NS)).group_by(
        c.INSTANCE_ID, c.WINDOW_START_NS).agg(
        pl.col(c.QUEUE_S).quantile(0.9, "linear").alias(_QUEUE_P90),
        pl.col(c.TTFT_S).quantile(0.9, "linear").alias(_TTFT_P90))
    joined = usage.join(latency, on=[c.INSTANCE_ID, c.WINDOW_START_NS], how="inner")
    return joined.group_by(c.INSTANCE_ID).agg(
        pl.len().alias("windows"),
        pl.corr(c.KV_CACHE_USAGE_MEAN, _QUEUE_P90).alias("corr_usage_queue"),
        pl.corr(c.KV_CACHE_USAGE_MEAN, _TTFT_P90).alias("corr_usage_ttft"),
        pl.col(c.KV_CACHE_USAGE_MEAN).max().alias("kv_usage_peak"),
        pl.col(_QUEUE_P90).max().alias("queue_p90_peak_s"),
    ).sort(c.INSTANCE_ID)
