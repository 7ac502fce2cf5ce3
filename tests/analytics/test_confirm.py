"""Issue 15: a decode-side blip that nothing explains and no one waited longer for is not
an incident (random fleets 15010, 13010, 12007: bursts of short answers in a replayed trace
lifted a host's TPOT p99 for three windows, named with scores of 0.01-0.06, while the mean
end-to-end latency fell 10-25%; `analytics/confirm.py`)."""

from __future__ import annotations

import dataclasses
import json

import polars as pl

from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.pipeline.schema import columns as c

from . import issue15_cases as cases
from .synthetic import FleetSpec, SynthData, generate

H = 3600


def _short_answers_with_a_slow_tail(longer: bool, seed: int = 161, shorter: float = 0.5
                                    ) -> tuple[SynthData, FleetSpec]:
    """On h01 one request in eight decodes 3x slower per token; every answer is
    ``shorter`` x as long (``longer``: as long as before, so everyone waits longer)."""
    spec = FleetSpec(duration_s=3 * H, seed=seed)
    data = generate(spec)
    on = cases._during(data, spec, c.ARRIVAL_NS) & (pl.col(c.HOST_NAME) == "h01")
    tail = on & (pl.col(c.ARRIVAL_NS) % 8 == 0)
    shorter = 1.0 if longer else shorter
    data.requests = data.requests.with_columns(
        pl.when(tail).then(pl.col(c.TPOT_S) * 3).otherwise(pl.col(c.TPOT_S)).alias(c.TPOT_S),
        (pl.col(c.DECODE_S) * pl.when(tail).then(3.0).otherwise(1.0)
         * pl.when(on).then(shorter).otherwise(1.0)).alias(c.DECODE_S),
        pl.when(on).then((pl.col(c.OUTPUT_TOKENS) * shorter).cast(pl.Int64))
        .otherwise(pl.col(c.OUTPUT_TOKENS)).alias(c.OUTPUT_TOKENS),
    )
    data.requests = cases._scale(data.requests, on, {})  # TTFT and e2e follow
    return cases.rewindow(data, spec), spec


def _incidents(longer: bool, config: AnalyticsConfig) -> pl.DataFrame:
    data, spec = _short_answers_with_a_slow_tail(longer)
    res = cases.run(data, config)
    lo = spec.start_ns + int(cases.START * 1e9)
    return res.incidents.filter((pl.col(c.END_NS) > lo)
                                & (pl.col(c.START_NS) < lo + cases.DURATION * 10**9))


def test_a_tpot_tail_with_shorter_answers_and_no_cause_is_withheld() -> None:
    config = AnalyticsConfig()
    reported = _incidents(False, dataclasses.replace(config, confirm_min_score=None))
    assert set(reported[c.METRIC]) & set(config.confirm_metrics), reported  # it breached
    assert _incidents(False, config).is_empty()


def test_the_same_tail_with_answers_as_long_as_before_is_reported() -> None:
    # Everyone on h01 now waits longer end to end: reported, whatever the causes score.
    assert not _incidents(True, AnalyticsConfig()).is_empty()


def _e2e_ratio(res_incidents: pl.DataFrame, causes: pl.DataFrame) -> float:
    top = causes.filter((pl.col(c.RANK) == 1) & pl.col(c.INCIDENT_ID).is_in(
        res_incidents[c.INCIDENT_ID].implode()))
    e2e = json.loads(top[c.EVIDENCE][0])["e2e_mean_s"]
    return e2e["incident"] / e2e["baseline"]


def test_a_tpot_tail_whose_mean_e2e_rose_less_than_the_noise_is_withheld() -> None:
    # Random fleet 16001 (A100 TP4, Azure replay) clean run: TPOT p99 x8 on h02 for three
    # windows, top cause 0.02, mean e2e +3.5% over ~700 requests: within the sampling noise
    # of a mean, where any rise at all used to count as users waiting longer.
    data, spec = _short_answers_with_a_slow_tail(False, shorter=0.82)
    lo = spec.start_ns + int(cases.START * 1e9)
    window = (pl.col(c.END_NS) > lo) & (pl.col(c.START_NS) < lo + cases.DURATION * 10**9)
    old = cases.run(data, AnalyticsConfig(confirm_min_e2e_rise=0.0))
    tpot = old.incidents.filter(window & pl.col(c.METRIC).is_in(["tpot_p99_s", "tpot_p50_s"]))
    assert not tpot.is_empty(), old.incidents
    assert 1.0 < _e2e_ratio(tpot, old.causes) < 1.05  # the case is what it claims
    new = cases.run(data, AnalyticsConfig())
    assert new.incidents.filter(window & pl.col(c.METRIC).is_in(
        ["tpot_p99_s", "tpot_p50_s"])).is_empty(), new.incidents


def test_a_tpot_tail_nothing_explains_whose_mean_e2e_rose_under_10_percent_is_withheld(
        ) -> None:
    # Random seeds 12, 18, 22 and 25 (session 11): four false incidents on TPOT or p99
    # tails of replayed traffic, top cause under 0.2, mean e2e +5-10% over a few hundred
    # requests. Rescored at 10% no incident injected on seeds 7 and 11-25 was lost.
    data, spec = _short_answers_with_a_slow_tail(False, shorter=0.86)
    lo = spec.start_ns + int(cases.START * 1e9)
    window = (pl.col(c.END_NS) > lo) & (pl.col(c.START_NS) < lo + cases.DURATION * 10**9)
    tpot = pl.col(c.METRIC).is_in(["tpot_p99_s", "tpot_p50_s"])
    old = cases.run(data, AnalyticsConfig(confirm_min_e2e_rise=0.05))
    reported = old.incidents.filter(window & tpot)
    assert not reported.is_empty(), old.incidents
    assert 1.05 < _e2e_ratio(reported, old.causes) < 1.10  # the case is what it claims
    assert cases.run(data, AnalyticsConfig()).incidents.filter(window & tpot).is_empty()


def test_a_ttft_tail_nothing_explains_with_the_mean_unchanged_is_withheld() -> None:
    # Random fleets 16001 and 11000 clean runs: TTFT p99 x5 on one host for three windows
    # (a few of the replayed trace's longest prompts queued together), top cause 0.01-0.03,
    # mean e2e -7% to +3%. One request in sixteen on h01 waits 4x longer here; the median
    # and the mean do not move.
    spec = FleetSpec(duration_s=3 * H, seed=171)
    data = generate(spec)
    on = cases._during(data, spec, c.ARRIVAL_NS) & (pl.col(c.HOST_NAME) == "h01")
    data.requests = cases._scale(data.requests, on & (pl.col(c.ARRIVAL_NS) % 16 == 0),
                                 {c.QUEUE_S: 1.0, c.PREFILL_S: 4.0})
    data = cases.rewindow(data, spec)
    lo = spec.start_ns + int(cases.START * 1e9)
    window = (pl.col(c.END_NS) > lo) & (pl.col(c.START_NS) < lo + cases.DURATION * 10**9)
    tails = pl.col(c.METRIC).is_in(["ttft_p99_s", "e2e_p99_s"])
    old = cases.run(data, AnalyticsConfig(confirm_metrics=("tpot_p99_s", "tpot_p50_s")))
    assert not old.incidents.filter(window & tails).is_empty(), old.incidents
    assert cases.run(data, AnalyticsConfig()).incidents.filter(window).is_empty()
