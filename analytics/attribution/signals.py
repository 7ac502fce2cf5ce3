"""Attribution step (c): engine, GPU and traffic signals in the incident versus baseline.

Per host: KV-cache usage, preemptions per minute, token-level prefix hit rate and hits per
second, waiting requests, and from the requests themselves decode time per token, prefill
time per uncached prompt token and overhead. Per GPU: SM clock, temperature, power versus
limit, utilisation and the share of samples with thermal or power-cap throttle reasons. For
the scope: arrival rate, prompt length, cached-token ratio and cached tokens per second.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from fleetlens.analytics.attribution.context import IncidentContext
from fleetlens.pipeline.samples import counter_increase
from fleetlens.pipeline.schema import columns as c

#: NVML clocks-event-reason bits (nvmlClocksEventReason*).
THERMAL_BITS = 0x20 | 0x40  # SwThermalSlowdown | HwThermalSlowdown
POWER_BITS = 0x04 | 0x80  # SwPowerCap | HwPowerBrakeSlowdown

Pair = tuple[float | None, float | None]  # (baseline, incident)
#: prompt tokens the engines' prefix caches served per second (a host signal), and cached
#: prompt tokens per second from the requests (a scope signal): the reuse itself, where
#: the hit rate is reuse per token asked for
PREFIX_HITS_PER_S, CACHED_PER_S = "prefix_hits_per_s", "cached_per_s"


@dataclass
class Signals:
    """Signal values as (baseline, incident) pairs."""

    scope: dict[str, Pair] = field(default_factory=dict)
    hosts: dict[str, dict[str, Pair]] = field(default_factory=dict)
    gpus: dict[str, dict[str, Pair]] = field(default_factory=dict)
    gpu_host: dict[str, str] = field(default_factory=dict)
    instance_gpus: dict[str, list[str]] = field(default_factory=dict)
    #: request signals per engine instance (a tensor-parallel group's GPUs share them)
    instances: dict[str, dict[str, Pair]] = field(default_factory=dict)


def _rows(frame: pl.DataFrame, key: str, aggs: list[pl.Expr]) -> dict[str, dict[str, Any]]:
    if frame.is_empty():
        return {}
    out = frame.group_by(key).agg(aggs)
    return {row.pop(key): row for row in out.iter_rows(named=True)}


def _pairs(base: dict[str, dict[str, Any]], inc: dict[str, dict[str, Any]]
           ) -> dict[str, dict[str, Pair]]:
    result: dict[str, dict[str, Pair]] = {}
    for key in sorted(set(base) | set(inc)):
        b, i = base.get(key, {}), inc.get(key, {})
        result[key] = {name: (b.get(name), i.get(name)) for name in set(b) | set(i)}
    return result


_INCREASES = {c.PREEMPTIONS_TOTAL: "_pre", c.PREFIX_CACHE_HITS_TOTAL: "_hits",
              c.PREFIX_CACHE_QUERIES_TOTAL: "_q"}


def _engine(frame: pl.DataFrame, minutes: float) -> dict[str, dict[str, Any]]:
    if frame.is_empty():
        return {}
    # The pipeline's one definition of a counter's increase: a restart counts the new value.
    instance = [c.HOST_NAME, c.INSTANCE_ID]
    frame = frame.sort(c.TS_NS).with_columns(
        counter_increase(pl.col(column), instance).fill_null(0).alias(alias)
        for column, alias in _INCREASES.items())
    per_instance = frame.group_by(*instance).agg(
        pl.col(c.KV_CACHE_USAGE).mean().alias("kv_mean"),
        pl.col(c.KV_CACHE_USAGE).max().alias("kv_max"),
        (pl.col("_pre").sum() / max(minutes, 1e-9)).alias("preempt_per_min"),
        pl.col("_hits").sum().alias("_hits"),
        pl.col("_q").sum().alias("_q"),
        pl.col(c.NUM_WAITING).mean().alias("waiting"),
        pl.col(c.NUM_RUNNING).mean().alias("running"),
    )
    return _rows(per_instance, c.HOST_NAME, [
        pl.col("kv_mean").mean(), pl.col("kv_max").max(), pl.col("preempt_per_min").sum(),
        (pl.col("_hits").sum() / pl.col("_q").sum()).alias(c.PREFIX_HIT_RATE),
        pl.col("waiting").sum(), pl.col("running").sum(),
        (pl.col("_hits").sum() / max(minutes * 60, 1e-9)).alias(PREFIX_HITS_PER_S),
    ])


def _requests(frame: pl.DataFrame, key: str, seconds: float) -> dict[str, dict[str, Any]]:
    network = (pl.col(c.NETWORK_S).fill_null(0).mean() if c.NETWORK_S in frame.columns
               else pl.lit(0.0)).alias("network")
    return _rows(frame, key, [
        network,
        (pl.col(c.DECODE_S).sum() / (pl.col(c.OUTPUT_TOKENS) - 1).clip(lower_bound=0).sum()
         .clip(lower_bound=1)).alias("tpot"),
        (pl.col(c.PREFILL_S).sum() / (pl.col(c.INPUT_TOKENS) - pl.col(c.CACHED_TOKENS)
                                      .fill_null(0)).clip(lower_bound=1).sum())
        .alias("prefill_per_token"),
        pl.col(c.QUEUE_S).mean().alias("queue"),
        pl.col(c.OVERHEAD_S).mean().alias("overhead"),
        (pl.len() / max(seconds, 1e-9)).alias("rps"),
    ])


def _gpus(frame: pl.DataFrame) -> dict[str, dict[str, Any]]:
    reasons = pl.col(c.CLOCKS_EVENT_REASONS).fill_null(0)
    return _rows(frame, c.GPU_UUID, [
        pl.col(c.HOST_NAME).first().alias("host"),
        pl.col(c.SM_CLOCK_MHZ).mean().alias("sm_clock"),
        pl.col(c.TEMP_C).mean().alias("temp"),
        pl.col(c.POWER_W).mean().alias("power"),
        pl.col(c.POWER_LIMIT_W).mean().alias("power_limit"),
        (pl.col(c.POWER_W) / pl.col(c.POWER_LIMIT_W)).mean().alias("power_vs_limit"),
        pl.col(c.UTIL_GPU).mean().alias("util"),
        pl.col(c.UTIL_MEM).mean().alias(c.UTIL_MEM),
        ((reasons & THERMAL_BITS) > 0).mean().alias("thermal_frac"),
        ((reasons & POWER_BITS) > 0).mean().alias("power_cap_frac"),
        # Whether the agent reports clock-event reasons at all: "no bit set" is evidence
        # against a throttle only when the bits are reported.
        pl.col(c.CLOCKS_EVENT_REASONS).is_not_null().mean().alias("reasons_known"),
    ])


def _scope(frame: pl.DataFrame, seconds: float) -> dict[str, Any]:
    if frame.is_empty():
        return {}
    return frame.select(
        (pl.len() / max(seconds, 1e-9)).alias("rps"),
        pl.col(c.INPUT_TOKENS).mean().alias(c.INPUT_TOKENS),
        pl.col(c.OUTPUT_TOKENS).mean().alias(c.OUTPUT_TOKENS),
        (pl.col(c.CACHED_TOKENS).fill_null(0).sum() / pl.col(c.INPUT_TOKENS).sum()
         .clip(lower_bound=1)).alias("cached_ratio"),
        (pl.col(c.CACHED_TOKENS).fill_null(0).sum() / max(seconds, 1e-9)).alias(CACHED_PER_S),
    ).row(0, named=True)


def _host_of(values: dict[str, Pair]) -> str | None:
    pair = values.get("host", (None, None))
    return pair[1] or pair[0]  # type: ignore[return-value]


def up_seconds(engine: pl.DataFrame, start_ns: int, end_ns: int) -> float:
    """Seconds of ``[start_ns, end_ns)`` in which the scope's engines reported: the span
    less every gap between their samples (and the span's ends) over three times the usual
    gap. A restarted server receives no requests while it is down; counted as time, those
    seconds would read as a lull (the real vLLM KV case: a 3 req/s load read as 1.44 req/s
    over a baseline holding a restart, and the same load after it as a x1.7 surge). The
    whole span where no engine reported at all (no engine metrics is no outage)."""
    span = max(end_ns - start_ns, 0) / 1e9
    if engine.is_empty():
        return span
    ts = engine[c.TS_NS].unique().sort()
    edges = pl.concat([pl.Series([start_ns]), ts.filter(ts.is_between(start_ns, end_ns)),
                       pl.Series([end_ns])]).cast(pl.Int64)
    gaps = edges.diff().drop_nulls()
    if gaps.len() < 3:
        return span
    usual = float(gaps.median())
    down = float(gaps.filter(gaps > 3 * usual).sum()) - usual * int((gaps > 3 * usual).sum())
    return max(span - down / 1e9, span * 0.05)


def collect_signals(ctx: IncidentContext) -> Signals:
    """All signals of one incident, baseline versus incident (rates over the seconds the
    engines were up, :func:`up_seconds`)."""
    inc_s = up_seconds(ctx.engine_inc, ctx.start_ns, ctx.end_ns)
    base_s = up_seconds(ctx.engine_base, ctx.base_start_ns, ctx.base_end_ns)
    sig = Signals()
    b, i = _scope(ctx.requests_base, base_s), _scope(ctx.requests_inc, inc_s)
    sig.scope = {k: (b.get(k), i.get(k)) for k in set(b) | set(i)}
    hosts = _pairs(_engine(ctx.engine_base, base_s / 60), _engine(ctx.engine_inc, inc_s / 60))
    req = _pairs(_requests(ctx.requests_base, c.HOST_NAME, base_s),
                 _requests(ctx.requests_inc, c.HOST_NAME, inc_s))
    for host, values in req.items():
        hosts.setdefault(host, {}).update(values)
    sig.hosts = hosts
    gpus = _pairs(_gpus(ctx.gpu_base), _gpus(ctx.gpu_inc))
    if c.GPU_UUID in ctx.requests_inc.columns:
        per_gpu = _pairs(_requests(ctx.requests_base.drop_nulls(c.GPU_UUID), c.GPU_UUID, base_s),
                         _requests(ctx.requests_inc.drop_nulls(c.GPU_UUID), c.GPU_UUID, inc_s))
        for gpu, values in per_gpu.items():
            gpus.setdefault(gpu, {}).update(values)
    if c.INSTANCE_ID in ctx.requests_inc.columns:
        sig.instances = _pairs(
            _requests(ctx.requests_base.drop_nulls(c.INSTANCE_ID), c.INSTANCE_ID, base_s),
            _requests(ctx.requests_inc.drop_nulls(c.INSTANCE_ID), c.INSTANCE_ID, inc_s))
    sig.gpu_host = {g: _host_of(v) for g, v in gpus.items() if _host_of(v)}
    sig.gpus = gpus
    for row in ctx.instance_gpus.iter_rows(named=True):
        sig.instance_gpus.setdefault(row[c.INSTANCE_ID], []).append(row[c.GPU_UUID])
    return sig


def ratio(pair: Pair | None, default: float = 1.0) -> float:
    """incident / baseline of a pair, ``default`` when either side is missing or zero."""
    if not pair or pair[0] is None or pair[1] is None or pair[0] == 0:
        return default
    return float(pair[1]) / float(pair[0])


def delta(pair: Pair | None) -> float:
    """incident - baseline of a pair, 0 when either side is missing."""
    if not pair or pair[0] is None or pair[1] is None:
        return 0.0
    return float(pair[1]) - float(pair[0])


def value(pair: Pair | None, side: int = 1, default: float = 0.0) -> float:
    """One side of a pair (1: incident, 0: baseline)."""
    if not pair or pair[side] is None:
        return default
    return float(pair[side])
