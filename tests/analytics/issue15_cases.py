"""Issue 15's cases on the synthetic fleet: faults as they looked on fleets of other shapes.

Each builder generates a fleet with :mod:`analytics.synthetic` and then reshapes the
symptoms the way the reported fleet showed them (e.g. long prompts pushing the GPUs to their
power limit), so a rule change can be checked against the case that went wrong.
"""

from __future__ import annotations

import polars as pl

from fleetlens.analytics.analyse import Analysis, analyse
from fleetlens.analytics.attribution import Tables
from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.pipeline.schema import columns as c
from tests.analytics.synthetic import NS, FleetSpec, Injected, SynthData, generate
from tests.analytics.synthetic_windows import windows_from

H = 3600
START = 1.5 * H
DURATION = 600


def gpu(host: int, index: int) -> str:
    """The synthetic fleet's GPU uuid of ``h{host}`` GPU ``index``."""
    return f"GPU-{host:04x}{index:04x}-0000-0000-0000-{host * 64 + index:012x}"


def _during(data: SynthData, spec: FleetSpec, column: str, start_s: float = START,
            duration_s: float = DURATION) -> pl.Expr:
    lo = spec.start_ns + int(start_s * NS)
    return pl.col(column).is_between(lo, lo + int(duration_s * NS), closed="left")


def _scale(requests: pl.DataFrame, on: pl.Expr, factors: dict[str, float]) -> pl.DataFrame:
    """Multiply request phase columns where ``on`` holds; TTFT and e2e follow."""
    return requests.with_columns(
        pl.when(on).then(pl.col(k) * v).otherwise(pl.col(k)).alias(k)
        for k, v in factors.items()
    ).with_columns(
        (pl.col(c.QUEUE_S) + pl.col(c.PREFILL_S)).alias(c.TTFT_S),
        (pl.col(c.QUEUE_S) + pl.col(c.PREFILL_S) + pl.col(c.DECODE_S)
         + pl.col(c.OVERHEAD_S)).alias(c.E2E_S),
    )


def rewindow(data: SynthData, spec: FleetSpec) -> SynthData:
    """Recompute `windows` after the requests or samples were reshaped."""
    data.windows = windows_from(data.requests, data.engine_samples, data.gpu_samples,
                                spec.window_s)
    return data


def run(data: SynthData, config: AnalyticsConfig | None = None) -> Analysis:
    """Analyse a synthetic fleet like the runner would."""
    tables = Tables.from_frames(data.requests, data.engine_samples, data.gpu_samples,
                                data.windows, data.instance_gpus)
    return analyse(tables, config or AnalyticsConfig())


def incident_causes(res: Analysis, start_s: float = START, spec: FleetSpec | None = None
                    ) -> tuple[dict, pl.DataFrame]:
    """The incident overlapping the injected window and its ranked causes."""
    spec = spec or FleetSpec()
    lo = spec.start_ns + int(start_s * NS)
    hits = res.incidents.filter((pl.col(c.END_NS) > lo)
                                & (pl.col(c.START_NS) < lo + DURATION * NS)).sort(c.START_NS)
    assert hits.height, f"no incident near {start_s} s: {res.incidents}"
    incident = hits.row(0, named=True)
    causes = res.causes.filter(pl.col(c.INCIDENT_ID) == incident[c.INCIDENT_ID]).sort(c.RANK)
    return incident, causes


def prefix_drop_busy(seed: int = 3) -> tuple[SynthData, FleetSpec]:
    """Prefix reuse gone fleet-wide: prompts are prefilled in full, the GPUs get busier and
    decode steps share them with the extra prefill (TPOT +30%), TTFT about x3.5."""
    spec = FleetSpec(duration_s=3 * H, seed=seed)
    data = generate(spec, [Injected("prefix_cache_drop", "service_name=chat", START,
                                    DURATION)])
    on = _during(data, spec, c.ARRIVAL_NS)
    # Full prompts saturate the per-step token budget: each prefill spans more steps.
    data.requests = _scale(data.requests, on, {c.PREFILL_S: 2.5, c.DECODE_S: 1.3,
                                               c.TPOT_S: 1.3})
    busy = _during(data, spec, c.TS_NS)
    data.gpu_samples = data.gpu_samples.with_columns(
        pl.when(busy).then((pl.col(c.UTIL_GPU) + 0.25).clip(upper_bound=1.0))
        .otherwise(pl.col(c.UTIL_GPU)).alias(c.UTIL_GPU))
    return rewindow(data, spec), spec


def long_prompts_at_power_limit(seed: int = 4) -> tuple[SynthData, FleetSpec]:
    """Prompts x4 fleet-wide: the GPUs run at their (unchanged) power limit and the clocks
    drop 20%, with no power-cap reason bit set."""
    spec = FleetSpec(duration_s=3 * H, seed=seed)
    data = generate(spec, [Injected("long_prompts", "service_name=chat", START, DURATION,
                                    magnitude=0.75)])
    slower = _during(data, spec, c.ARRIVAL_NS)  # 20% lower clocks: tokens take 1.25x
    data.requests = _scale(data.requests, slower, {c.PREFILL_S: 1.25, c.DECODE_S: 1.25,
                                                   c.TPOT_S: 1.25})
    on = _during(data, spec, c.TS_NS)
    data.gpu_samples = data.gpu_samples.with_columns(
        pl.when(on).then(pl.col(c.POWER_LIMIT_W) * 0.97).otherwise(pl.col(c.POWER_W))
        .alias(c.POWER_W),
        pl.when(on).then(pl.col(c.SM_CLOCK_MHZ) * 0.8).otherwise(pl.col(c.SM_CLOCK_MHZ))
        .alias(c.SM_CLOCK_MHZ),
    )
    return rewindow(data, spec), spec


def kv_pressure_idle_gpus(seed: int = 5) -> tuple[SynthData, FleetSpec]:
    """The demo's KV pressure: the cache runs out on h01, requests wait (queue up by
    seconds), the few running ones decode a little slower and the GPUs idle; preemptions
    are rare."""
    spec = FleetSpec(duration_s=3 * H, seed=seed)
    data = generate(spec, [Injected("kv_cache_pressure", "host_name=h01", START, DURATION,
                                    magnitude=2.0)])
    on = _during(data, spec, c.TS_NS) & (pl.col(c.HOST_NAME) == "h01")
    data.gpu_samples = data.gpu_samples.with_columns(
        pl.when(on).then(pl.col(c.UTIL_GPU) * 0.2).otherwise(pl.col(c.UTIL_GPU))
        .alias(c.UTIL_GPU),
        pl.when(on).then(pl.col(c.UTIL_MEM) * 0.2).otherwise(pl.col(c.UTIL_MEM))
        .alias(c.UTIL_MEM))
    # Rare preemptions: one per minute instead of the generator's dozens.
    eng = data.engine_samples.sort(c.INSTANCE_ID, c.TS_NS)
    step = pl.col(c.PREEMPTIONS_TOTAL).diff().fill_null(0).over(c.INSTANCE_ID)
    eng = eng.with_columns(pl.when(on).then(step.clip(upper_bound=0) + 1 / 6)
                           .otherwise(step).alias("_step"))
    data.engine_samples = eng.with_columns(
        pl.col("_step").cum_sum().over(c.INSTANCE_ID).alias(c.PREEMPTIONS_TOTAL),
        pl.when(on).then(pl.col(c.NUM_RUNNING) * 0.3).otherwise(pl.col(c.NUM_RUNNING))
        .alias(c.NUM_RUNNING),
    ).drop("_step")
    return rewindow(data, spec), spec


def kv_shrunk_decode_faster(seed: int = 6) -> tuple[SynthData, FleetSpec]:
    """A vLLM server with a shrunken KV cache: requests queue and are recomputed (prefill
    per uncached token up), while the smaller batches decode slightly *faster*."""
    spec = FleetSpec(duration_s=3 * H, seed=seed)
    data = generate(spec, [Injected("kv_cache_pressure", "host_name=h01", START, DURATION)])
    on = _during(data, spec, c.ARRIVAL_NS) & (pl.col(c.HOST_NAME) == "h01")
    faster = 0.985 / 1.4  # undo the generator's decode slowdown, then 1.5% faster
    data.requests = _scale(data.requests, on, {c.DECODE_S: faster, c.TPOT_S: faster,
                                               c.PREFILL_S: 1.8})
    busy = _during(data, spec, c.TS_NS) & (pl.col(c.HOST_NAME) == "h01")
    data.gpu_samples = data.gpu_samples.with_columns(
        pl.when(busy).then((pl.col(c.UTIL_GPU) + 0.25).clip(upper_bound=1.0))
        .otherwise(pl.col(c.UTIL_GPU)).alias(c.UTIL_GPU))
    return rewindow(data, spec), spec


STALL_START = 1.75 * H


def stall_after_incident(seed: int = 9, earlier: bool = True) -> tuple[SynthData, FleetSpec]:
    """A TP=2 fleet: a 4-minute collective stall on h01 (TPOT +45% at p50 and p99) 15
    minutes after the end of an earlier 30-minute incident on the same host (``earlier``),
    which is still inside the 60-window look-back of the rolling baseline."""
    spec = FleetSpec(duration_s=3 * H, gpus_per_host=2, tp=2, seed=seed)
    injected = [Injected("collective_stall", "host_name=h01", STALL_START, 240,
                         magnitude=0.5625)]
    if earlier:
        injected.append(Injected("engine_overhead", "host_name=h01", 1.0 * H, 1800,
                                 magnitude=1.0))
    return generate(spec, injected), spec


SECOND_START = START + 420


def two_causes_back_to_back(seed: int = 13, second: str = "engine_overhead"
                            ) -> tuple[SynthData, FleetSpec]:
    """Two incidents on h01 two minutes apart (closer than the 3-minute merge gap): KV
    pressure for 5 minutes, then ``second`` (the engine's CPU falls behind) for 5."""
    spec = FleetSpec(duration_s=3 * H, seed=seed)
    data = generate(spec, [
        Injected("kv_cache_pressure", "host_name=h01", START, 300),
        Injected(second, "host_name=h01", SECOND_START, 300),
    ])
    return data, spec


def tp4_one_slow_gpu(seed: int = 21) -> tuple[SynthData, FleetSpec]:
    """One GPU at 70% speed in a TP=4 group on h01: the group runs at its pace, so every
    GPU of it shows the same (lower) activity and nothing singles the slow one out; the
    GPUs sit near their power limit with clocks 1% down, no reason bits set."""
    spec = FleetSpec(duration_s=3 * H, gpus_per_host=4, tp=4, seed=seed, rps_per_instance=4.0)
    data = generate(spec, [Injected("slow_gpu", f"gpu_uuid={gpu(1, 2)}", START, DURATION,
                                    magnitude=0.54)])
    on = _during(data, spec, c.TS_NS) & (pl.col(c.HOST_NAME) == "h01")
    base = data.gpu_samples.filter(~on)
    data.gpu_samples = data.gpu_samples.with_columns(
        pl.when(on).then(base[c.UTIL_GPU].mean() * 0.85).otherwise(pl.col(c.UTIL_GPU))
        .alias(c.UTIL_GPU),
        pl.when(on).then(base[c.UTIL_MEM].mean() * 0.85).otherwise(pl.col(c.UTIL_MEM))
        .alias(c.UTIL_MEM),
        pl.when(on).then(pl.col(c.POWER_LIMIT_W) * 0.96).otherwise(pl.col(c.POWER_W))
        .alias(c.POWER_W),
        pl.when(on).then(pl.col(c.SM_CLOCK_MHZ) * 0.99).otherwise(pl.col(c.SM_CLOCK_MHZ))
        .alias(c.SM_CLOCK_MHZ),
    )
    return rewindow(data, spec), spec


def slower_prefill(seed: int = 31) -> tuple[SynthData, FleetSpec]:
    """Prefill 50% slower per token on h01 with the prompts unchanged, and no engine or GPU
    signal to say why."""
    spec = FleetSpec(duration_s=3 * H, seed=seed)
    data = generate(spec)
    on = _during(data, spec, c.ARRIVAL_NS) & (pl.col(c.HOST_NAME) == "h01")
    data.requests = _scale(data.requests, on, {c.PREFILL_S: 1.5})
    return rewindow(data, spec), spec


def thermal_bits_without_heat(seed: int = 41) -> tuple[SynthData, FleetSpec]:
    """One GPU on h01 reports the thermal-slowdown bit and runs slower, but its temperature
    did not move (62 C as before): no thermal evidence."""
    spec = FleetSpec(duration_s=3 * H, seed=seed)
    target = gpu(1, 0)
    data = generate(spec, [Injected("thermal_throttle", f"gpu_uuid={target}", START,
                                    DURATION)])
    on = _during(data, spec, c.TS_NS) & (pl.col(c.GPU_UUID) == target)
    data.gpu_samples = data.gpu_samples.with_columns(
        pl.when(on).then(pl.col(c.TEMP_C) - 28).otherwise(pl.col(c.TEMP_C)).alias(c.TEMP_C))
    return rewindow(data, spec), spec


def slow_gpu_tripping_power_bits(seed: int = 51) -> tuple[SynthData, FleetSpec]:
    """Random fleet 7008's straggler: one TP1 GPU on h01 decodes 2.4x slower at a normal
    clock; busier, it draws more power and trips the power-cap reason bit in a third of its
    samples while its clock dips 3%. The bits are a symptom: 3% cannot explain 2.4x."""
    from tests.analytics.synthetic import POWER_CAP_BIT

    spec = FleetSpec(duration_s=3 * H, seed=seed)
    target = gpu(1, 0)
    data = generate(spec, [Injected("slow_gpu", f"gpu_uuid={target}", START, DURATION,
                                    magnitude=1.75)])
    on = _during(data, spec, c.TS_NS) & (pl.col(c.GPU_UUID) == target)
    tripped = on & (pl.col(c.TS_NS) // NS % 3 == 0)
    data.gpu_samples = data.gpu_samples.with_columns(
        pl.when(on).then(pl.col(c.SM_CLOCK_MHZ) * 0.97).otherwise(pl.col(c.SM_CLOCK_MHZ))
        .alias(c.SM_CLOCK_MHZ),
        pl.when(on).then(pl.col(c.POWER_LIMIT_W) * 0.9).otherwise(pl.col(c.POWER_W))
        .alias(c.POWER_W),
        pl.when(tripped).then(pl.col(c.CLOCKS_EVENT_REASONS) | POWER_CAP_BIT)
        .otherwise(pl.col(c.CLOCKS_EVENT_REASONS)).alias(c.CLOCKS_EVENT_REASONS),
    )
    return rewindow(data, spec), spec


def tp2_straggler_beside_a_healthy_group(seed: int = 61) -> tuple[SynthData, FleetSpec]:
    """Random fleet 7000's straggler: two TP2 instances per 4-GPU host; one GPU of h01's
    second instance is slow. That instance decodes slower, its sibling on h01 does not, so
    h01's own figures move half as much: the host is no straggler, the instance is."""
    spec = FleetSpec(duration_s=3 * H, hosts=3, gpus_per_host=4, tp=2, seed=seed,
                     rps_per_instance=3.0)
    data = generate(spec, [Injected("slow_gpu", f"gpu_uuid={gpu(1, 2)}", START, DURATION,
                                    magnitude=0.5)])
    return data, spec


def _fill_cache(data: SynthData, on: pl.Expr, running: float = 1.0) -> None:
    """Where ``on`` holds: the KV cache 100% full, 2 more preemptions a sample, and the
    running requests x ``running``."""
    eng = data.engine_samples.sort(c.INSTANCE_ID, c.TS_NS)
    step = pl.col(c.PREEMPTIONS_TOTAL).diff().fill_null(0).over(c.INSTANCE_ID)
    eng = eng.with_columns(pl.when(on).then(step + 2.0).otherwise(step).alias("_step"))
    data.engine_samples = eng.with_columns(
        pl.col("_step").cum_sum().over(c.INSTANCE_ID).alias(c.PREEMPTIONS_TOTAL),
        pl.when(on).then(1.0).otherwise(pl.col(c.KV_CACHE_USAGE)).alias(c.KV_CACHE_USAGE),
        pl.when(on).then(pl.col(c.NUM_RUNNING) * running).otherwise(pl.col(c.NUM_RUNNING))
        .alias(c.NUM_RUNNING),
    ).drop("_step")


def long_prompts_fill_the_cache(seed: int = 71) -> tuple[SynthData, FleetSpec]:
    """Random fleet 7008: prompts x1.9 on a small-GPU service fill every host's KV cache
    (100% full, preemptions), and requests queue for blocks. The cache is the mechanism;
    the demand (x1.7 tokens per second) is the cause."""
    spec = FleetSpec(duration_s=3 * H, seed=seed)
    data = generate(spec, [Injected("long_prompts", "service_name=chat", START, DURATION,
                                    magnitude=0.225)])
    _fill_cache(data, _during(data, spec, c.TS_NS))
    queued = _during(data, spec, c.ARRIVAL_NS)
    data.requests = _scale(data.requests, queued, {c.QUEUE_S: 20.0})
    return rewindow(data, spec), spec


def long_prompts_then_one_gpu_capped(seed: int = 81) -> tuple[SynthData, FleetSpec]:
    """Random fleet 1002: prompts x2 across the service, and inside that incident one GPU
    of h01 capped at 90% of its limit for 3 minutes. The cap is real, but one GPU of eight
    explains at most its host's part of a service-wide excess."""
    spec = FleetSpec(duration_s=3 * H, seed=seed)
    data = generate(spec, [
        Injected("long_prompts", "service_name=chat", START, DURATION, magnitude=0.25),
        Injected("power_cap", f"gpu_uuid={gpu(1, 0)}", START + 300, 180, magnitude=0.3),
    ])
    # the backlog: requests queue for seconds behind the longer prefills, on every host
    data.requests = _scale(data.requests, _during(data, spec, c.ARRIVAL_NS), {c.QUEUE_S: 30.0})
    return rewindow(data, spec), spec


def stall_fills_the_cache(seed: int = 91) -> tuple[SynthData, FleetSpec]:
    """Random fleet 1002: a 30x collective stall on a TP2 host; each request holds its KV
    blocks 5x longer, twice as many run at once, and the cache fills (100%, preemptions).
    A cache that shrank would run fewer requests, not more."""
    spec = FleetSpec(duration_s=3 * H, gpus_per_host=2, tp=2, seed=seed, rps_per_instance=4.0)
    data = generate(spec, [Injected("collective_stall", "host_name=h01", START, DURATION,
                                    magnitude=4.0)])
    _fill_cache(data, _during(data, spec, c.TS_NS) & (pl.col(c.HOST_NAME) == "h01"),
                running=2.5)
    queued = _during(data, spec, c.ARRIVAL_NS) & (pl.col(c.HOST_NAME) == "h01")
    data.requests = _scale(data.requests, queued, {c.QUEUE_S: 20.0})
    return rewindow(data, spec), spec


def longer_prompts_halve_the_hit_rate(seed: int = 101) -> tuple[SynthData, FleetSpec]:
    """Random fleet 1002: prompts x2 with the same shared prefixes. The prefix cache works
    as before, but each prompt's prefix is half as large a part of it: the hit rate (hits
    over prompt tokens) falls from 60% to 25%, and the cached share of the prompts too."""
    spec = FleetSpec(duration_s=3 * H, seed=seed)
    data = generate(spec, [Injected("long_prompts", "service_name=chat", START, DURATION,
                                    magnitude=0.25)])
    on = _during(data, spec, c.TS_NS)
    eng = data.engine_samples.sort(c.INSTANCE_ID, c.TS_NS)
    step = pl.col(c.PREFIX_CACHE_HITS_TOTAL).diff().fill_null(0).over(c.INSTANCE_ID)
    eng = eng.with_columns(pl.when(on).then(step * 0.42).otherwise(step).alias("_step"))
    data.engine_samples = eng.with_columns(
        pl.col("_step").cum_sum().over(c.INSTANCE_ID).alias(c.PREFIX_CACHE_HITS_TOTAL),
    ).drop("_step")
    arrived = _during(data, spec, c.ARRIVAL_NS)
    data.requests = data.requests.with_columns(
        pl.when(arrived).then(pl.col(c.CACHED_TOKENS) // 2).otherwise(pl.col(c.CACHED_TOKENS))
        .alias(c.CACHED_TOKENS))
    return rewindow(data, spec), spec


def kv_pressure_without_gpu_telemetry(seed: int = 111) -> tuple[SynthData, FleetSpec]:
    """One instance and no GPU telemetry at all (the real vLLM CPU server of the tests):
    a shrunken KV cache fills, requests queue and are preempted and recomputed, so decode
    per token doubles (x2 here)."""
    spec = FleetSpec(hosts=1, gpus_per_host=1, duration_s=3 * H, seed=seed)
    data = generate(spec, [Injected("kv_cache_pressure", "host_name=h00", START, DURATION,
                                    magnitude=2.5)])
    data.gpu_samples = data.gpu_samples.clear()
    data.instance_gpus = data.instance_gpus.clear()
    return rewindow(data, spec), spec
