"""The elasticity points: per engine instance and window, the batch it ran and what it served.

Stage ``capacity_windows(tables, window_s) -> capacity_windows`` (without ``good_requests``,
``mbu``, ``mfu``: :mod:`analytics.capacity.stage` adds them). Inputs: `engine_samples`
(running requests, KV usage and capacity, token counters), `requests` (latencies, arrivals),
`instance_gpus` (the GPUs of an instance: its TP size), `gpu_samples` (the GPU model),
`engine_configs` (the configuration fingerprint in force); the instance's GPU power
(:func:`.energy.instance_power`, private). Grain: one row per (host,
instance, window) with at least one engine sample.
"""

from __future__ import annotations

import polars as pl

from fleetlens.analytics.attribution import Tables
from fleetlens.analytics.capacity.energy import instance_power
from fleetlens.pipeline.schema import columns as c

NS = 1_000_000_000
#: ``config`` of an instance whose agent reports no configuration fingerprint.
NO_CONFIG = "-"
UNKNOWN = "unknown"
_TPOT50, _TPOT99 = c.percentile_column("tpot", "p50"), c.percentile_column("tpot", "p99")
_TTFT50, _TTFT99 = c.percentile_column("ttft", "p50"), c.percentile_column("ttft", "p99")
#: private columns carried to the stage (mean tokens and phases of the window's requests)
MEAN_OUTPUT, MEAN_CONTEXT, MEAN_PREFILL = "_mean_output", "_mean_context", "_mean_prefill_s"
KV_CAPACITY = "_kv_capacity"
#: decode steps per second seen by the window's requests (their output tokens - 1 over their
#: decode time) and the KV tokens a running sequence holds, weighted by its decode tokens
STEPS_S, CONTEXT_PER_TOKEN = "_steps_s", "_context_per_token"
GEN_TOK_S = "_gen_tok_s"
#: TTFT p99 of the requests that *arrived* in the window (null: none arrived). The TTFT
#: limit of the knee judges this one: a request's wait for a seat happens at the load it
#: arrived into, while its latency window (the middle of its decode) may be a later one that
#: the queue drained into (a real vLLM's overload: batch 5.6 and TTFT p99 5.0 s in the window
#: after it, which put the knee at 3.4 against the sweep's 8)
TTFT99_ARRIVED = "_ttft_p99_arrived"
#: the share of the window's engine samples with a request running: decode steps happen
#: only then (STEPS_S is the rate the requests saw while they decoded)
BUSY = "_busy"
#: the running batch's time average over the second half of the window minus that over the
#: first (null where a half has no segment): a window the load stepped through mid-way
BATCH_TREND = "_batch_trend"
#: the window's load was steady (:func:`steady`): only such windows place the TPOT curve
STEADY = "_steady"
#: A window is steady while its batch moved by at most this many x sqrt(batch + 1) and its
#: arrivals and completions differ by at most this many x sqrt(arrivals + completions):
#: both units are the Poisson noise of a steady load (running requests of a steady Poisson
#: load are Poisson: variance = mean), an upper bound on it; on the simulator the steady
#: windows' move had a standard deviation of 0.83 unit (under 3% dropped), their imbalance
#: 0.2.
MAX_MOVE = 2.0


def _window(ts: str, window_s: int) -> pl.Expr:
    step = window_s * NS
    return (pl.col(ts) // step * step).alias(c.WINDOW_START_NS)


def _counter_rate(counter: str) -> pl.Expr:
    """Increase of a cumulative counter per second between consecutive samples (a reset,
    the engine restarted, counts from zero)."""
    inc = pl.col(counter).diff().over(c.HOST_NAME, c.INSTANCE_ID)
    inc = pl.when(inc < 0).then(pl.col(counter)).otherwise(inc)
    return inc


def _time_means(samples: pl.LazyFrame, window_s: int) -> pl.LazyFrame:
    """Per (host, instance, window): the time averages of the running batch and the KV usage
    (``_batch_t``, ``_kv_t``), by the trapezoid rule between consecutive samples; each
    segment counts in the window holding its middle. And :data:`BATCH_TREND`: the batch's
    time average over the segments whose middle lies in the window's second half minus
    that over its first half.

    The mean of the samples stamped in [start, start + window) describes the interval half
    a sampling interval earlier, while the window's latencies are those of the requests that
    decoded in it: where the load stepped up at a window's start, its first sample still
    showed the old batch (a random simulated fleet: batch 54 for a window that ran 60,
    knee -12%). A gap longer than a window is not bridged."""
    keys = [c.HOST_NAME, c.INSTANCE_ID]
    nxt = {name: pl.col(name).shift(-1).over(keys) for name in
           (c.TS_NS, c.NUM_RUNNING, c.KV_CACHE_USAGE)}
    seconds = (nxt[c.TS_NS] - pl.col(c.TS_NS)) / NS
    middle = pl.col(c.TS_NS) + (nxt[c.TS_NS] - pl.col(c.TS_NS)) // 2
    segments = samples.select(
        *keys, seconds.alias("_seg_s"),
        (middle // (window_s * NS) * (window_s * NS)).alias(c.WINDOW_START_NS),
        (middle % (window_s * NS) >= window_s * NS // 2).alias("_late"),
        ((pl.col(c.NUM_RUNNING) + nxt[c.NUM_RUNNING]) / 2).alias("_running"),
        ((pl.col(c.KV_CACHE_USAGE) + nxt[c.KV_CACHE_USAGE]) / 2).alias("_kv"),
    ).filter((pl.col("_seg_s") > 0) & (pl.col("_seg_s") <= window_s))
    # plain sums of seconds and value x seconds (a null value: no seconds), the second half's
    # apart; sums are what a group-by does fastest (filtered sums cost +40% on 2M samples)
    col, late = pl.col, pl.col("_late")
    sums = {"_late_s": pl.when(late & col("_running").is_not_null()).then(col("_seg_s")).sum(),
            "_late_x": pl.when(late).then(col("_running") * col("_seg_s")).sum()}
    for value in ("_running", "_kv"):
        sums[f"{value}_s"] = pl.when(col(value).is_not_null()).then(col("_seg_s")).sum()
        sums[f"{value}_x"] = (col(value) * col("_seg_s")).sum()

    def mean(x: pl.Expr, seconds: pl.Expr) -> pl.Expr:
        # null (not 0/0 = NaN, which coalesce keeps) where no segment has the value: an
        # engine that does not report the gauge (NaN reached the knee's least squares)
        return pl.when(seconds > 0).then(x / seconds)

    return segments.group_by(*keys, c.WINDOW_START_NS).agg(**sums).select(
        *keys, c.WINDOW_START_NS,
        mean(col("_running_x"), col("_running_s")).alias("_batch_t"),
        mean(col("_kv_x"), col("_kv_s")).alias("_kv_t"),
        (mean(col("_late_x"), col("_late_s"))
         - mean(col("_running_x") - col("_late_x"), col("_running_s") - col("_late_s")))
        .alias(BATCH_TREND))


def engine_windows(engine: pl.LazyFrame, window_s: int) -> pl.LazyFrame:
    """Per (host, instance, window): the running batch and KV usage over the window's time
    (:func:`_time_means`; the mean of its samples where no segment between two samples
    falls in it), the KV capacity, and the generated and prompt tokens per second from the
    engine's counters."""
    names = engine.collect_schema().names()
    capacity = (pl.col(c.KV_CAPACITY_TOKENS).max() if c.KV_CAPACITY_TOKENS in names
                else pl.lit(None, pl.Float64))
    dt = (pl.col(c.TS_NS).diff().over(c.HOST_NAME, c.INSTANCE_ID) / NS)
    samples = (engine.sort(c.HOST_NAME, c.INSTANCE_ID, c.TS_NS)
               .with_columns(_window(c.TS_NS, window_s), dt.alias("_dt"),
                             _counter_rate(c.GENERATION_TOKENS_TOTAL).alias("_gen"),
                             _counter_rate(c.PROMPT_TOKENS_TOTAL).alias("_prompt"),
                             _counter_rate(c.PREFIX_CACHE_HITS_TOTAL).alias("_hits"),
                             _counter_rate(c.PREFIX_CACHE_QUERIES_TOTAL).alias("_queries")))
    keys = [c.HOST_NAME, c.INSTANCE_ID, c.WINDOW_START_NS]
    return samples.group_by(*keys).agg(
        pl.col(c.MODEL).drop_nulls().first(),
        pl.col(c.NUM_RUNNING).mean().alias(c.BATCH),
        pl.col(c.KV_CACHE_USAGE).mean().alias(c.KV_CACHE_USAGE_MEAN),
        capacity.cast(pl.Float64).alias(KV_CAPACITY),
        (pl.col("_gen").sum() / pl.col("_dt").sum()).alias(GEN_TOK_S),
        (pl.col(c.NUM_RUNNING) > 0).mean().alias(BUSY),
        # prompt tokens computed: those the prefix cache did not serve
        (pl.col("_prompt").sum() / pl.col("_dt").sum()
         * (1 - (pl.col("_hits").sum() / pl.col("_queries").sum()).fill_nan(0.0)
            .fill_null(0.0)).clip(0.0, 1.0)).alias("_prompt_tok_s"),
    ).join(_time_means(samples, window_s), on=keys, how="left").with_columns(
        pl.coalesce("_batch_t", c.BATCH).alias(c.BATCH),
        pl.coalesce("_kv_t", c.KV_CACHE_USAGE_MEAN).alias(c.KV_CACHE_USAGE_MEAN),
    ).drop("_batch_t", "_kv_t")


def latency_window(window_s: int) -> pl.Expr:
    """The window a request's latencies describe: the one holding the middle of its decode
    (end - decode_s / 2; its arrival without a decode time). Its TPOT is the batch it decoded
    in: by arrival, a request that came as the load climbed would count the next window's
    batch against this one."""
    step = window_s * NS
    mid = (pl.col(c.END_NS) - (pl.col(c.DECODE_S).fill_null(0.0) * NS / 2).cast(pl.Int64))
    return (pl.coalesce(mid, pl.col(c.ARRIVAL_NS)) // step * step).alias(c.WINDOW_START_NS)


def request_windows(requests: pl.LazyFrame, window_s: int) -> pl.LazyFrame:
    """Per (instance, window): arrivals per second and their TTFT p99
    (:data:`TTFT99_ARRIVED`) by arrival, and by :func:`latency_window` the requests, their
    TPOT and TTFT p50/p99, and their mean output tokens, context and prefill time."""
    ok = requests.filter(~pl.col(c.IS_ERROR).fill_null(False))
    keys = [c.HOST_NAME, c.INSTANCE_ID, c.WINDOW_START_NS]
    arrivals = ok.with_columns(_window(c.ARRIVAL_NS, window_s)).group_by(keys).agg(
        (pl.len() / window_s).alias(c.RPS),
        pl.col(c.TTFT_S).quantile(0.99, "linear").alias(TTFT99_ARRIVED))
    decoded = (pl.col(c.OUTPUT_TOKENS) - 1).clip(lower_bound=0).cast(pl.Float64)
    latencies = ok.with_columns(latency_window(window_s)).group_by(keys).agg(
        pl.col(c.SERVICE_NAME).drop_nulls().mode().first(),
        pl.len().cast(pl.Int64).alias(c.REQUESTS),
        pl.col(c.TPOT_S).quantile(0.5, "linear").alias(_TPOT50),
        pl.col(c.TPOT_S).quantile(0.99, "linear").alias(_TPOT99),
        pl.col(c.TTFT_S).quantile(0.5, "linear").alias(_TTFT50),
        pl.col(c.TTFT_S).quantile(0.99, "linear").alias(_TTFT99),
        pl.col(c.OUTPUT_TOKENS).mean().cast(pl.Float64).alias(MEAN_OUTPUT),
        # a running request holds its prompt and, on average, half its output
        (pl.col(c.INPUT_TOKENS) + pl.col(c.OUTPUT_TOKENS) / 2).mean().alias(MEAN_CONTEXT),
        pl.col(c.PREFILL_S).mean().alias(MEAN_PREFILL),
        (decoded.sum() / pl.col(c.DECODE_S).filter(decoded > 0).sum()).alias(STEPS_S),
        ((pl.col(c.INPUT_TOKENS) + pl.col(c.OUTPUT_TOKENS) / 2) * pl.col(c.OUTPUT_TOKENS)).sum()
        .truediv(pl.col(c.OUTPUT_TOKENS).sum()).alias(CONTEXT_PER_TOKEN),
    )
    return latencies.join(arrivals, on=keys, how="full", coalesce=True)


def instance_hardware(tables: Tables) -> pl.LazyFrame:
    """Per instance: its TP size (GPUs mapped to it, else 1) and GPU model (of its GPUs,
    else of its host's)."""
    mapping = tables.instance_gpus.lazy().filter(pl.col(c.GPU_UUID).is_not_null())
    models = tables.gpu_samples.group_by(c.GPU_UUID).agg(pl.col(c.GPU_MODEL).drop_nulls()
                                                         .first())
    per_gpu = mapping.join(models, on=c.GPU_UUID, how="left")
    return per_gpu.group_by(c.INSTANCE_ID).agg(
        pl.col(c.GPU_UUID).n_unique().cast(pl.Int64).alias(c.TP),
        pl.col(c.GPU_MODEL).drop_nulls().first().alias("_gpu_of_instance"))


def _configs(tables: Tables, points: pl.LazyFrame) -> pl.LazyFrame:
    """The configuration fingerprint in force at each window (the last one seen start
    before the window ended)."""
    if tables.engine_configs is None:
        return points.with_columns(pl.lit(NO_CONFIG).alias(c.CONFIG))
    configs = (tables.engine_configs.select(c.HOST_NAME, c.INSTANCE_ID, c.START_NS,
                                            c.CONFIG_FINGERPRINT)
               .unique().sort(c.START_NS))
    probe = points.with_columns((pl.col(c.WINDOW_START_NS) + pl.col(c.WINDOW_S) * NS - 1)
                                .alias("_end")).sort("_end")
    joined = probe.join_asof(configs, left_on="_end", right_on=c.START_NS,
                             by=[c.HOST_NAME, c.INSTANCE_ID], strategy="backward",
                             # both sides are sorted on the time as a whole, hence per group
                             check_sortedness=False)
    return joined.with_columns(pl.col(c.CONFIG_FINGERPRINT).fill_null(NO_CONFIG)
                               .alias(c.CONFIG)).drop("_end", c.START_NS, c.CONFIG_FINGERPRINT)


def steady(window_s: int) -> pl.Expr:
    """Whether a window's load was steady (:data:`MAX_MOVE`). Where the load stepped up
    mid-window, the batch's time average lies between the two levels while most of the
    window's requests decoded at the higher one, so its TPOT sits above the step-time curve
    at its batch (random simulated fleets: 10-26% where the rate passed the knee, which
    pulled a fitted knee 13% low); where it fell (the load ended), the requests left finish
    at a smaller batch than the average (10-27% below). A batch move not measured (a half
    window without a segment) is no move."""
    moved = pl.col(BATCH_TREND).abs().fill_null(0.0)
    arrived, done = pl.col(c.RPS) * window_s, pl.col(c.REQUESTS).cast(pl.Float64)
    return ((moved <= MAX_MOVE * (pl.col(c.BATCH) + 1.0).sqrt())
            & ((arrived - done).abs() <= MAX_MOVE * (arrived + done).sqrt())).alias(STEADY)


def capacity_windows(tables: Tables, window_s: int) -> pl.LazyFrame:
    """Stage: the tables -> one elasticity point per (host, instance, window).

    ``kv_tokens`` is the KV usage x the engine's reported capacity where it reports one,
    else batch x the mean context of the window's requests. Output tokens/s per GPU come
    from the engine's generation counter (every token, whatever its request's window).
    """
    engine = engine_windows(tables.engine_samples, window_s)
    reqs = request_windows(tables.requests, window_s)
    hosts = tables.gpu_samples.group_by(c.HOST_NAME).agg(
        pl.col(c.GPU_MODEL).drop_nulls().first().alias("_gpu_of_host"))
    service = (tables.requests.group_by(c.INSTANCE_ID)
               .agg(pl.col(c.SERVICE_NAME).drop_nulls().mode().first().alias("_service")))
    points = (engine.join(reqs, on=[c.HOST_NAME, c.INSTANCE_ID, c.WINDOW_START_NS],
                          how="left")
              .join(instance_power(tables, window_s), on=[c.INSTANCE_ID, c.WINDOW_START_NS],
                    how="left")
              .join(service, on=c.INSTANCE_ID, how="left")
              .join(instance_hardware(tables), on=c.INSTANCE_ID, how="left")
              .join(hosts, on=c.HOST_NAME, how="left"))
    tp = pl.col(c.TP).fill_null(1)
    kv = pl.when(pl.col(KV_CAPACITY) > 0).then(pl.col(c.KV_CACHE_USAGE_MEAN)
                                               * pl.col(KV_CAPACITY))
    points = points.with_columns(
        pl.lit(window_s, pl.Int64).alias(c.WINDOW_S),
        pl.coalesce(c.SERVICE_NAME, "_service").fill_null(UNKNOWN).alias(c.SERVICE_NAME),
        pl.col(c.MODEL).fill_null(UNKNOWN),
        pl.coalesce("_gpu_of_instance", "_gpu_of_host").fill_null(UNKNOWN).alias(c.GPU_MODEL),
        tp.alias(c.TP),
        pl.col(c.REQUESTS).fill_null(0),
        pl.col(c.RPS).fill_null(0.0),
        kv.otherwise(pl.col(c.BATCH) * pl.col(MEAN_CONTEXT)).alias(c.KV_TOKENS),
        (pl.col(GEN_TOK_S) / tp).alias(c.OUTPUT_TOK_S_PER_GPU),
        (pl.col("_prompt_tok_s") / tp).alias(c.PROMPT_TOK_S_PER_GPU),
    )
    return _configs(tables, points.with_columns(steady(window_s))).drop(
        "_service", "_gpu_of_instance", "_gpu_of_host", "_prompt_tok_s")
