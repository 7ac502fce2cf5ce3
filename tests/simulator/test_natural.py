"""Natural surges and saturations (simulator/natural.py): the bursts a replayed trace brings
by itself and the KV caches the workload alone fills, labelled from an incident-free run's
latency probe, and how the accuracy scorer treats an incident on one (analytics/accuracy.py)."""

from __future__ import annotations

import polars as pl

from fleetlens.analytics.accuracy import score_clean, score_run
from fleetlens.pipeline.schema import columns as c
from fleetlens.simulator.control import LatencyProbe
from fleetlens.simulator.natural import natural_saturations, natural_surges

START_NS = 1_767_225_600 * 10**9
MIN = 60 * 10**9


def _probe(minutes: int = 60, burst: tuple[int, int] = (40, 42), burst_factor: float = 2.5,
           slow: tuple[int, int] = (40, 46), slow_ttft: float = 2.0,
           preempt: tuple[int, int] = (0, 0), preempt_every: int = 5) -> LatencyProbe:
    """One service on two engines: 100 arrivals a minute (TTFT 50 ms), ``burst_factor`` x
    as many in the ``burst`` minutes, TTFT ``slow_ttft`` for arrivals in the ``slow`` ones,
    every ``preempt_every``-th arrival of the ``preempt`` minutes preempted once."""
    probe = LatencyProbe(START_NS)
    for m in range(minutes):
        n = int(100 * (burst_factor if burst[0] <= m < burst[1] else 1))
        ttft = slow_ttft if slow[0] <= m < slow[1] else 0.05
        for i in range(n):
            engine = f"h0{1 + i % 2}/svc1a"
            preempted = int(preempt[0] <= m < preempt[1] and i % preempt_every == 0)
            probe.rows[engine].append((m * 60 + i * 60 / n, ttft, 0.02, ttft + 2.0, -1.0, -1.0,
                                       preempted))
    return probe


def test_a_burst_that_slowed_requests_is_a_natural_surge() -> None:
    (surge,) = natural_surges(_probe())
    assert surge.service == "svc1a"
    assert surge.start_ns == START_NS + 40 * MIN
    # the last burst minute (41) plus the drain allowance (5 minutes), inclusive
    assert surge.end_ns == START_NS + 47 * MIN
    assert surge.arrivals_ratio == 2.5 and surge.latency_ratio == 40.0


def test_a_burst_that_slowed_nothing_or_a_slowdown_without_a_burst_is_not() -> None:
    assert natural_surges(_probe(slow_ttft=0.05)) == []  # served without a queue
    assert natural_surges(_probe(burst_factor=1.0)) == []  # slower, same arrivals
    assert natural_surges(_probe(burst_factor=1.2)) == []  # under the burst ratio, x1.3
    assert natural_surges(_probe(burst=(3, 5), slow=(3, 9))) == []  # under 5 minutes' look-back


def test_a_burst_in_the_first_quarter_hour_is_labelled_as_the_analytics_judge_it() -> None:
    # the analytics judge a series from its 5th window (the warm-up band): a burst in minute
    # 10 is an incident there, so it is a natural surge here (random fleet 37005's control)
    (surge,) = natural_surges(_probe(burst=(10, 12), slow=(10, 16)))
    assert surge.start_ns == START_NS + 10 * MIN and surge.arrivals_ratio == 2.5


def test_a_burst_is_one_definition_for_the_labeller_and_the_analytics() -> None:
    # x1.4 arrivals with latency moved: the analytics may call it a surge (rate-led demand
    # counts from the burst ratio), so the labeller must know it as natural (it wanted x1.5)
    (surge,) = natural_surges(_probe(burst_factor=1.4))
    assert surge.arrivals_ratio == 1.4
    from types import SimpleNamespace

    from fleetlens.analytics.attribution.rules import rate_led_demand
    from fleetlens.pipeline.schema.bursts import BURST_RATIO
    from fleetlens.simulator.natural import SURGE_RATIO

    assert SURGE_RATIO == BURST_RATIO

    def demand(arrivals: float) -> float:  # twice the tokens asked for, arrivals x ``arrivals``
        scope = {"rps": (1.0, arrivals), c.INPUT_TOKENS: (100.0, 200.0 / arrivals),
                 c.OUTPUT_TOKENS: (100.0, 200.0 / arrivals)}
        return rate_led_demand(SimpleNamespace(signals=SimpleNamespace(scope=scope)))

    assert demand(BURST_RATIO - 0.01) == 0.0 < demand(BURST_RATIO + 0.05)

    from fleetlens.analytics.attribution.rules import surge_strength

    def by_rate(arrivals: float) -> float:  # arrivals alone (the ramp began at x1.25 before)
        scope = {"rps": (1.0, arrivals)}
        return surge_strength(SimpleNamespace(signals=SimpleNamespace(scope=scope)))

    assert by_rate(BURST_RATIO - 0.01) == 0.0 < by_rate(BURST_RATIO) < by_rate(BURST_RATIO + 0.05)


def test_the_labeller_starts_judging_where_the_warm_up_band_does() -> None:
    from fleetlens.analytics.config import AnalyticsConfig
    from fleetlens.simulator.natural import MIN_LOOKBACK_MIN

    assert MIN_LOOKBACK_MIN == AnalyticsConfig().warmup_min_windows


def _incidents(*starts_min: int) -> pl.DataFrame:
    return pl.DataFrame({
        c.INCIDENT_ID: [f"i{m}" for m in starts_min],
        c.START_NS: [START_NS + m * MIN for m in starts_min],
        c.END_NS: [START_NS + (m + 4) * MIN for m in starts_min],
        c.DETECTED_NS: [START_NS + (m + 3) * MIN for m in starts_min],
        c.SERVICE_NAME: ["svc1a"] * len(starts_min), c.HOST_NAME: ["*"] * len(starts_min),
        c.METRIC: ["ttft_p99_s"] * len(starts_min)})


def _causes(named: dict[int, str]) -> pl.DataFrame:
    return pl.DataFrame({c.INCIDENT_ID: [f"i{m}" for m in named], c.RANK: [1] * len(named),
                         c.CAUSE: list(named.values()),
                         c.SUBJECT: ["service_name=svc1a"] * len(named)})


def test_an_incident_on_a_natural_surge_named_a_surge_is_not_false() -> None:
    natural = [{"service": s.service, c.START_NS: s.start_ns, c.END_NS: s.end_ns}
               for s in natural_surges(_probe())]
    # on the surge and named right; on the surge but named a cache; far from it
    incidents = _incidents(41, 43, 10)
    causes = _causes({41: "traffic_surge", 43: "kv_cache_pressure", 10: "traffic_surge"})
    clean = score_clean(incidents, 1.0, causes, natural)
    assert (clean.natural_named, clean.clean_false_incidents) == (1, 2)
    assert any("on a natural traffic_surge spike, named kv_cache_pressure" in m
               for m in clean.misses)
    # the same in an incident run's clean time; without labels every one is false
    run = score_run([], incidents, causes, natural=natural)
    assert (run.natural_named, run.false_incidents) == (1, 2)
    assert score_clean(incidents, 1.0, causes).clean_false_incidents == 3


def test_a_cache_full_and_preempting_that_slowed_requests_is_a_natural_saturation() -> None:
    # Random fleet 29007: a daily cycle filled an undersized cache (no burst); 20% of the
    # requests preempted in minutes 40-42, TTFT x40 until minute 46.
    (full,) = natural_saturations(_probe(burst_factor=1.0, preempt=(40, 43)))
    assert full.service == "svc1a" and full.cause == "kv_cache_pressure"
    assert (full.start_ns, full.end_ns) == (START_NS + 40 * MIN, START_NS + 48 * MIN)
    assert full.preempted_share == 0.2 and full.latency_ratio == 40.0
    assert natural_surges(_probe(burst_factor=1.0, preempt=(40, 43))) == []


def test_preemptions_that_slowed_nothing_or_were_always_there_are_no_saturation() -> None:
    calm = _probe(burst_factor=1.0, slow_ttft=0.05, preempt=(40, 43))
    assert natural_saturations(calm) == []  # preempting, latency as usual
    assert natural_saturations(_probe(burst_factor=1.0)) == []  # slower, nothing preempted
    # one request in 50 preempted: under the 5% a saturation minute needs
    assert natural_saturations(_probe(burst_factor=1.0, preempt=(40, 43),
                                      preempt_every=50)) == []
    # 20% preempted all along: the usual share, not a change
    assert natural_saturations(_probe(burst_factor=1.0, preempt=(0, 60))) == []


def test_an_incident_on_a_natural_saturation_named_the_cache_is_not_false() -> None:
    natural = [{"service": s.service, c.START_NS: s.start_ns, c.END_NS: s.end_ns,
                "cause": s.cause}
               for s in natural_saturations(_probe(burst_factor=1.0, preempt=(40, 43)))]
    incidents = _incidents(41, 43, 44)
    causes = _causes({41: "kv_cache_pressure", 43: "traffic_surge", 44: "collective_stall"})
    clean = score_clean(incidents, 1.0, causes, natural)
    assert (clean.natural_named, clean.saturation_named, clean.clean_false_incidents) == (1, 1, 2)
    assert any("on a natural kv_cache_pressure spike, named traffic_surge" in m
               for m in clean.misses)
    assert score_clean(incidents, 1.0, causes).clean_false_incidents == 3
