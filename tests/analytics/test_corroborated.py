"""Issue 15: a latency rise under its band is an incident when its mechanism's signal fell
with it (`analytics.detect.corroborated_breaches`). On the random suite 15 of 39 missed
incidents (seeds 7, 11-16) were host prefix-cache drops: the host's hit rate 0.13-0.53 -> 0,
its TTFT p50 x1.2-1.5, under a band whose floor is the host's usual replayed-trace highs."""

from __future__ import annotations

import polars as pl

from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.detect import corroborated_breaches, explain_detector
from fleetlens.pipeline.schema import columns as c

from . import issue15_cases as cases
from .synthetic import FleetSpec, Injected, SynthData, generate

H = 3600
H01 = pl.col(c.HOST_NAME) == "h01"


def _bursty_host_loses_its_prefix_cache(hit_rate_during: float | None) -> tuple[SynthData,
                                                                                  FleetSpec]:
    """h01's TTFT doubles every sixth minute (bursts, so its band's floor is high); then its
    prefix cache is emptied for ten minutes (TTFT p50 x1.8, under that band).
    ``hit_rate_during``: instead of emptied, the hit rate only falls to this share of
    before (new conversations arriving) with the same TTFT."""
    spec = FleetSpec(duration_s=3 * H, seed=181)
    data = generate(spec, [Injected("prefix_cache_drop", "host_name=h01", cases.START,
                                    cases.DURATION)])
    during = cases._during(data, spec, c.ARRIVAL_NS) & H01
    minute = (pl.col(c.ARRIVAL_NS) - spec.start_ns) // (60 * 10**9)
    data.requests = cases._scale(data.requests, H01 & ~during & (minute % 6 == 0),
                                 {c.QUEUE_S: 1.0, c.PREFILL_S: 2.0})
    if hit_rate_during is not None:
        engine_on = cases._during(data, spec, c.TS_NS) & H01
        hits, queries = pl.col(c.PREFIX_CACHE_HITS_TOTAL), pl.col(c.PREFIX_CACHE_QUERIES_TOTAL)
        # Redo the hit counter: the usual rate before and after, a share of it during.
        step = (queries.diff().fill_null(queries)
                * pl.when(engine_on).then(hit_rate_during * 0.6).otherwise(0.6))
        data.engine_samples = data.engine_samples.sort(c.INSTANCE_ID, c.TS_NS).with_columns(
            step.cum_sum().over(c.INSTANCE_ID).alias(hits.meta.output_name()))
    return cases.rewindow(data, spec), spec


def _h01_incidents(data: SynthData, spec: FleetSpec, config: AnalyticsConfig) -> pl.DataFrame:
    res = cases.run(data, config)
    lo = spec.start_ns + int(cases.START * 1e9)
    window = (pl.col(c.END_NS) > lo) & (pl.col(c.START_NS) < lo + cases.DURATION * 10**9)
    found = res.incidents.filter(window & H01)
    top = res.causes.filter(pl.col(c.RANK) == 1).select(c.INCIDENT_ID, c.CAUSE, c.SUBJECT)
    return found.join(top, on=c.INCIDENT_ID, how="left")


def test_a_prefix_cache_emptied_on_a_bursty_host_is_found_by_its_rise_and_its_hit_rate(
) -> None:
    data, spec = _bursty_host_loses_its_prefix_cache(None)
    hit = data.windows.filter(H01 & pl.col(c.WINDOW_START_NS).is_between(
        spec.start_ns + int(cases.START * 1e9),
        spec.start_ns + int((cases.START + cases.DURATION) * 1e9), closed="left"))
    assert hit[c.PREFIX_HIT_RATE].max() < 0.06  # the cache is emptied
    assert _h01_incidents(data, spec, AnalyticsConfig(corroborated_metrics=())).is_empty()
    found = _h01_incidents(data, spec, AnalyticsConfig())
    assert found.height == 1, found
    row = found.row(0, named=True)
    assert row[c.DETECTOR] == "corroborated:prefix_hit_rate"
    assert (row[c.METRIC], row[c.CAUSE], row[c.SUBJECT]) == (
        "ttft_p50_s", "prefix_cache_drop", "host_name=h01")


def test_a_hit_rate_that_only_halved_does_not_lower_the_bar() -> None:
    # A burst of new conversations lowers the hit rate by half; with the same TTFT rise
    # (under the band) nothing is reported: only a cache emptied corroborates.
    data, spec = _bursty_host_loses_its_prefix_cache(0.5)
    assert _h01_incidents(data, spec, AnalyticsConfig()).is_empty()
    # ... and the same data with the cache emptied is found (the case can fail).
    emptied, _ = _bursty_host_loses_its_prefix_cache(0.0)
    assert not _h01_incidents(emptied, spec, AnalyticsConfig()).is_empty()


def _emptied_cache_windows(ttft_ratios: list[float]) -> pl.DataFrame:
    """Banded series of one host: TTFT p50 at ``ttft_ratios`` x its expected 155 ms while
    the prefix hit rate (expected 0.17) is 0, in consecutive minutes."""
    rows = []
    for minute, ratio in enumerate(ttft_ratios):
        for metric, value, expected in (("ttft_p50_s", 0.155 * ratio, 0.155),
                                        ("prefix_hit_rate", 0.0, 0.17)):
            rows.append({c.SERIES: f"{metric}{{h01}}", c.METRIC: metric,
                         c.SERVICE_NAME: "svc1a", c.MODEL: "m", c.HOST_NAME: "h01",
                         c.LEVEL: "host", c.TS_NS: minute * 60 * 10**9, c.VALUE: value,
                         c.REQUESTS: 95, c.EXPECTED: expected, "upper": expected * 1.5})
    return pl.DataFrame(rows)


def test_an_emptied_cache_whose_rise_dipped_to_x117_for_a_minute_is_found() -> None:
    # Random fleet 29002 (seed 29): a prefix-cache drop on h01 emptied the cache for four
    # minutes (hit rate 0.17 -> 0) and moved TTFT p50 x1.29, 1.17, 1.20, 1.26 against its
    # expected 155 ms. At a bar of 1.2 the x1.17 minute broke the run (missed); at 1.15 it
    # is one run of four windows.
    banded = _emptied_cache_windows([1.29, 1.165, 1.20, 1.26])
    found = corroborated_breaches(banded, AnalyticsConfig(), 60).collect()
    assert found.height == 1, found
    assert found.row(0, named=True)[c.DETECTOR] == "corroborated:prefix_hit_rate"
    assert (found[c.END_NS] - found[c.START_NS]).item() == 4 * 60 * 10**9
    # ... and a rise of x1.1 with the cache emptied stays under the bar.
    assert corroborated_breaches(_emptied_cache_windows([1.1] * 4), AnalyticsConfig(),
                                 60).collect().is_empty()


def test_the_detector_is_explained_in_words() -> None:
    config = AnalyticsConfig()
    both = explain_detector("band,corroborated:prefix_hit_rate", config)
    assert both.startswith("Above the upper band for 3 windows in a row. At least 1.15x")
    assert "prefix_hit_rate of the same scope fell to 10% of its expected value" in both
    assert explain_detector("slo:p99(e2e) > 850 ms", config) == (
        "SLO rule broken: p99(e2e) > 850 ms.")
