"""Issue 15's load cases: fleets that got busier by themselves, as random fleets 12001 and
7008 showed them (a replayed trace's bursts on a fleet with no headroom).

Built like :mod:`tests.analytics.issue15_cases`: a synthetic fleet, then the symptoms
reshaped the way the reported fleet showed them.
"""

from __future__ import annotations

import polars as pl

from fleetlens.pipeline.schema import columns as c
from tests.analytics.issue15_cases import (
    DURATION,
    START,
    _during,
    _fill_cache,
    _scale,
    gpu,
    rewindow,
)
from tests.analytics.synthetic import NS, POWER_CAP_BIT, FleetSpec, Injected, SynthData, generate

H = 3600


def surge_crowds_a_full_cache(seed: int = 111) -> tuple[SynthData, FleetSpec]:
    """Random fleet 12001: arrivals x1.5 on a service with no headroom; 1.5x as many
    requests run at once, the KV cache fills (100%, preemptions) and requests queue for
    seconds. A cache that shrank would run fewer requests, not more: the load filled it."""
    spec = FleetSpec(duration_s=3 * H, seed=seed)
    data = generate(spec, [Injected("traffic_surge", "service_name=chat", START, DURATION,
                                    magnitude=0.25)])
    _fill_cache(data, _during(data, spec, c.TS_NS), running=1.5)
    data.requests = _scale(data.requests, _during(data, spec, c.ARRIVAL_NS), {c.QUEUE_S: 8.0})
    return rewindow(data, spec), spec


def _surge_trips_power_bits(seed: int, surge: float, on_hosts: pl.Expr, every: int,
                            before: int, clock: float, slower: dict[str, float]
                            ) -> tuple[SynthData, FleetSpec]:
    """A surge (``surge``: magnitude) during which the GPUs of ``on_hosts`` trip the
    power-cap bit in all samples but one in ``every`` (one in ``before`` outside it) at
    ``clock`` x their SM clock, their requests' phases scaled by ``slower``."""
    spec = FleetSpec(duration_s=3 * H, seed=seed)
    data = generate(spec, [Injected("traffic_surge", "service_name=chat", START, DURATION,
                                    magnitude=surge)])
    on = _during(data, spec, c.TS_NS) & on_hosts
    sample = pl.col(c.TS_NS) // (10 * NS)  # the synthetic GPU samples are 10 s apart
    tripped = pl.when(on).then(sample % every != 0).otherwise(sample % before == 0)
    data.gpu_samples = data.gpu_samples.with_columns(
        pl.when(on).then(pl.col(c.SM_CLOCK_MHZ) * clock).otherwise(pl.col(c.SM_CLOCK_MHZ))
        .alias(c.SM_CLOCK_MHZ),
        pl.when(tripped).then(pl.col(c.CLOCKS_EVENT_REASONS) | POWER_CAP_BIT)
        .otherwise(pl.col(c.CLOCKS_EVENT_REASONS)).alias(c.CLOCKS_EVENT_REASONS),
    )
    data.requests = _scale(data.requests, _during(data, spec, c.ARRIVAL_NS) & on_hosts,
                           slower)
    return rewindow(data, spec), spec


def surge_trips_power_bits(seed: int = 121) -> tuple[SynthData, FleetSpec]:
    """Random fleet 12001 (L4s at a fixed 72 W limit): arrivals x1.5; every GPU, busier,
    trips the power-cap bit in two thirds of its samples instead of a fifth, and its clock
    dips 5%. Nothing capped the power: the limit is where it was, and 5% of clock cannot
    explain requests queueing for seconds."""
    return _surge_trips_power_bits(seed, 0.25, pl.lit(True), 3, 5, 0.95, {c.QUEUE_S: 8.0})


def surge_caps_the_clock(seed: int = 151) -> tuple[SynthData, FleetSpec]:
    """Random fleet 14007 (L4s at a fixed 72 W limit, a replayed trace): arrivals x1.8 on
    the service; on its busiest host every GPU trips the power-cap bit in seven samples of
    eight instead of one in three and loses 13% of its clock, and requests queue for
    seconds. A real throttle, but the demand's doing: the limit did not move."""
    return _surge_trips_power_bits(seed, 0.4, pl.col(c.HOST_NAME) == "h01", 8, 3, 0.87,
                                   {c.QUEUE_S: 8.0, c.DECODE_S: 1.15})


def small_burst_trips_every_hosts_power_bits(seed: int = 201
                                             ) -> tuple[SynthData, FleetSpec]:
    """Random fleet 29001 again (A100s at their fixed 400 W): in the x1.3-1.4 burst every
    GPU tripped the power-cap bit in 50-62% of its samples instead of 18-25% and lost 7-11%
    of its clock, on every host, while decode ran x1.4-6 slower; three host incidents were
    named ``power_cap``. Here arrivals x1.4 and on every host the bits in all samples but
    one in three (one in five before), the clock 10% down, decode x3, queueing."""
    return _surge_trips_power_bits(seed, 0.2, pl.lit(True), 3, 5, 0.90,
                                   {c.QUEUE_S: 8.0, c.DECODE_S: 1.8, c.TPOT_S: 1.8})


def burst_caps_every_l4(seed: int = 211) -> tuple[SynthData, FleetSpec]:
    """Random fleet 26006's clean control (L4s at a fixed 72 W, Llama-70B at TP8 on two
    hosts, a replayed trace): a natural x1.4 burst, the cache full, 114 requests waiting;
    the power-cap bits in 92% of the samples and the clock 13% down on both hosts, decode
    x1.5 on each. Named ``power_cap`` (0.27 over traffic_surge 0.15): every host was as
    slow, at the same fixed limit."""
    return _surge_trips_power_bits(seed, 0.2, pl.lit(True), 12, 3, 0.87,
                                   {c.QUEUE_S: 8.0, c.DECODE_S: 1.5, c.TPOT_S: 1.5})


def _stall_signature_everywhere(load: Injected, stall: float, seed: int, hosts: int = 2,
                                on: int | None = None) -> tuple[SynthData, FleetSpec]:
    """TP2 hosts under ``load``, ``on`` of them (all by default) with a stall's signature
    of ``stall``."""
    spec = FleetSpec(duration_s=3 * H, hosts=hosts, gpus_per_host=2, tp=2, seed=seed,
                     rps_per_instance=4.0)
    data = generate(spec, [load, *(
        Injected("collective_stall", f"host_name=h0{h}", START, DURATION, magnitude=stall)
        for h in range(hosts if on is None else on))])
    return data, spec


def surge_looks_like_a_stall_everywhere(seed: int = 131) -> tuple[SynthData, FleetSpec]:
    """Random fleet 7008 (L4s, TP2, a replayed trace): arrivals x1.6 and every TP group's
    batches 4x bigger: each step is longer and the GPUs' memory is less busy per token, on
    every host at once. It looks like a stalled link, but a link stalls on one group."""
    surge = Injected("traffic_surge", "service_name=chat", START, DURATION, magnitude=0.3)
    return _stall_signature_everywhere(surge, 2.0, seed)


def long_prompts_look_like_a_stall_everywhere(seed: int = 141) -> tuple[SynthData, FleetSpec]:
    """Random fleet 14011 (five 4-GPU hosts, TP4; prompts x3-4), here prompts x2 at the same
    arrivals. Every step carries more prefill, decode slows and the GPUs' memory is less
    busy per token on every host at once: a stalled link's signature, everywhere, from the
    prompts."""
    longer = Injected("long_prompts", "service_name=chat", START, DURATION, magnitude=0.25)
    return _stall_signature_everywhere(longer, 1.0, seed)


def small_burst_at_capacity(seed: int = 181) -> tuple[SynthData, FleetSpec]:
    """Random fleet 29001 (five 8-GPU hosts, Llama-70B at TP4, a replayed trace run at
    capacity): a natural burst of x1.3-1.4 arrivals; every host's batches grew x2-7, its
    decode x1.4-6, its GPUs' memory less busy per token, and each host's incident was named
    ``collective_stall``. Here four TP2 hosts, arrivals x1.4, three times the requests
    running and queueing for seconds, the signature on all four: a link stalls on one
    group, its peers stay as fast as they were."""
    surge = Injected("traffic_surge", "service_name=chat", START, DURATION, magnitude=0.2)
    data, spec = _stall_signature_everywhere(surge, 2.0, seed, hosts=4)
    on = _during(data, spec, c.TS_NS)
    data.engine_samples = data.engine_samples.with_columns(
        pl.when(on).then(pl.col(c.NUM_RUNNING) * 3).otherwise(pl.col(c.NUM_RUNNING)))
    data.requests = _scale(data.requests, _during(data, spec, c.ARRIVAL_NS), {c.QUEUE_S: 8.0})
    return rewindow(data, spec), spec


def one_stall_in_a_small_burst(seed: int = 191) -> tuple[SynthData, FleetSpec]:
    """The guard: a replayed trace drifting x1.3 in arrivals (random fleet 27011) while one
    TP group's link stalls; the other three hosts keep their pace."""
    drift = Injected("traffic_surge", "service_name=chat", START, DURATION, magnitude=0.15)
    return _stall_signature_everywhere(drift, 2.0, seed, hosts=4, on=1)


def _one_host_burst(seed: int, stalled: bool) -> tuple[SynthData, FleetSpec]:
    """One host running the service at TP4, a burst of x1.4 arrivals; requests queue for
    seconds and decode x5. With ``stalled`` its link stalls too (its GPUs wait, drawing
    less); without, the batch grew past the knee: memory idles per step as under a stall,
    but the GPUs work as hard as before."""
    spec = FleetSpec(duration_s=3 * H, hosts=1, gpus_per_host=4, tp=4, seed=seed,
                     rps_per_instance=6.0)
    burst = Injected("traffic_surge", "service_name=chat", START, DURATION, magnitude=0.2)
    stall = Injected("collective_stall", "host_name=h00", START, DURATION, magnitude=2.0)
    data = generate(spec, [burst, stall] if stalled else [burst])
    on = _during(data, spec, c.TS_NS)
    if not stalled:
        data.gpu_samples = data.gpu_samples.with_columns(
            pl.when(on).then(pl.col(c.UTIL_MEM) * 0.4).otherwise(pl.col(c.UTIL_MEM)),
            pl.when(on).then((pl.col(c.UTIL_GPU) * 1.05).clip(upper_bound=1.0))
            .otherwise(pl.col(c.UTIL_GPU)))
    data.engine_samples = data.engine_samples.with_columns(
        pl.when(on).then(pl.col(c.NUM_RUNNING) * 5).otherwise(pl.col(c.NUM_RUNNING)),
        pl.when(on).then(pl.col(c.NUM_WAITING) + 50).otherwise(pl.col(c.NUM_WAITING)))
    data.requests = _scale(data.requests, _during(data, spec, c.ARRIVAL_NS),
                           {c.QUEUE_S: 8.0, c.DECODE_S: 5.0, c.TPOT_S: 5.0})
    return rewindow(data, spec), spec


def one_host_burst_past_the_knee(seed: int = 221) -> tuple[SynthData, FleetSpec]:
    """Random fleet 41006's clean control (Qwen-32B at TP4 on the one A100 host of its
    service, a replayed trace): natural bursts of x1.3-1.6 arrivals queued 26-286 requests
    and made decode x3-7 slower while the GPUs' memory idled (x0.3-0.5) and their power
    held (x0.99-1.13). With no peer host to compare, six were named collective_stall."""
    return _one_host_burst(seed, stalled=False)


def one_host_stall_in_a_burst(seed: int = 231) -> tuple[SynthData, FleetSpec]:
    """The guard: the same burst while the host's link stalls (its GPUs draw less)."""
    return _one_host_burst(seed, stalled=True)


def new_conversations_lower_the_hit_rate(seed: int = 241) -> tuple[SynthData, FleetSpec]:
    """Random fleet 42000's clean control (a replayed trace): a burst of new conversations,
    x1.3 arrivals, brought prompts whose prefixes no cache held: the hit rate fell 45% ->
    26% while the tokens served from the cache per second held (x0.95). Here arrivals x1.5,
    the new requests miss the cache (the hit rate x1/1.5, hits per second as before) and
    requests queue; it was named prefix_cache_drop."""
    spec = FleetSpec(duration_s=3 * H, seed=seed)
    data = generate(spec, [Injected("traffic_surge", "service_name=chat", START, DURATION,
                                    magnitude=0.25)])
    hits = pl.col(c.PREFIX_CACHE_HITS_TOTAL)
    step = hits.diff().over(c.INSTANCE_ID).fill_null(hits)
    data.engine_samples = data.engine_samples.sort(c.INSTANCE_ID, c.TS_NS).with_columns(
        pl.when(_during(data, spec, c.TS_NS)).then(step / 1.5).otherwise(step)
        .cum_sum().over(c.INSTANCE_ID).alias(c.PREFIX_CACHE_HITS_TOTAL))
    data.requests = _scale(data.requests, _during(data, spec, c.ARRIVAL_NS),
                           {c.QUEUE_S: 4.0, c.PREFILL_S: 1.5})
    return rewindow(data, spec), spec


def _burst_with_longer_prompts(seed: int, surge: float, longer: float
                               ) -> tuple[SynthData, FleetSpec]:
    """Arrivals x(1 + 2 ``surge``) and prompts x(1 + 4 ``longer``) at once on the service,
    and requests queue for seconds."""
    spec = FleetSpec(duration_s=3 * H, seed=seed)
    data = generate(spec, [
        Injected("traffic_surge", "service_name=chat", START, DURATION, magnitude=surge),
        Injected("long_prompts", "service_name=chat", START, DURATION, magnitude=longer)])
    data.requests = _scale(data.requests, _during(data, spec, c.ARRIVAL_NS), {c.QUEUE_S: 20.0})
    return rewindow(data, spec), spec


def more_and_longer_requests(seed: int = 161) -> tuple[SynthData, FleetSpec]:
    """Random fleet 28009 (a replayed trace, no incident): a burst of new conversations
    brings x1.4 the arrivals *and* prompts x1.6 (x1.9-2.2 the tokens asked for per
    second), requests queue for seconds. Neither the rate nor the length alone reads as
    much of a change (x1.4 arrivals scored 0.15 as a surge, prompts x1.6 0.25), but
    together the demand doubled: the traffic surged."""
    return _burst_with_longer_prompts(seed, 0.2, 0.15)


def long_prompts_in_a_small_burst(seed: int = 171) -> tuple[SynthData, FleetSpec]:
    """Prompts x3 (an injected change) while a replayed trace's arrivals happen to run
    x1.3: the demand grew x3.9, but by the prompts; the arrivals are a bystander."""
    return _burst_with_longer_prompts(seed, 0.15, 0.5)


__all__ = ["DURATION", "START", "gpu"]
