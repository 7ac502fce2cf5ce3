"""Counters restart with their process: every consumer takes a counter's increase the one way
(pipeline.samples.counter_increase, Prometheus' increase()), so the KV-cache page and the
windows agree on how many preemptions there were."""

from __future__ import annotations

import polars as pl

from fleetlens.analytics.kvcache import kv_summary
from fleetlens.pipeline.schema import columns as c

NS = 10**9


def engine(preemptions: list[float], hits: list[float], queries: list[float]) -> pl.DataFrame:
    n = len(preemptions)
    return pl.DataFrame({
        c.TS_NS: [i * 10 * NS for i in range(n)], c.HOST_NAME: ["h1"] * n,
        c.INSTANCE_ID: ["h1/vllm-0"] * n, c.MODEL: ["llama-3.1-8b"] * n,
        c.KV_CACHE_USAGE: [0.5] * n, c.NUM_RUNNING: [4.0] * n, c.NUM_WAITING: [0.0] * n,
        c.PREEMPTIONS_TOTAL: preemptions, c.PREFIX_CACHE_HITS_TOTAL: hits,
        c.PREFIX_CACHE_QUERIES_TOTAL: queries,
    })


def test_a_restart_keeps_the_increase_after_it() -> None:
    # 10 -> 20 (+10), engine restarts and has counted 5 since (+5), then 8 (+3): 18 in all.
    # diff().clip(0) said 13: the 5 preemptions right after the restart were lost.
    frame = engine([10, 20, 5, 8], hits=[100, 200, 50, 80], queries=[200, 400, 100, 160])
    row = kv_summary(frame).row(0, named=True)
    assert row[c.PREEMPTIONS] == 18
    # hits +100 +50 +30 of queries +200 +100 +60: the same ratio as before the restart
    assert row[c.PREFIX_HIT_RATE] == 180 / 360


def test_a_missing_sample_does_not_lose_the_increase_across_it() -> None:
    frame = engine([0, None, 6, 9], hits=[0, 10, None, 30], queries=[0, 20, 40, 60])
    assert kv_summary(frame).row(0, named=True)[c.PREEMPTIONS] == 9


def test_attribution_signals_count_the_increase_after_a_restart() -> None:
    from fleetlens.analytics.attribution.signals import _engine

    frame = engine([10, 20, 5, 8], hits=[100, 200, 50, 80], queries=[200, 400, 100, 160])
    host = _engine(frame, minutes=1.0)["h1"]
    assert host["preempt_per_min"] == 18  # diff().clip(0) said 13
    assert host[c.PREFIX_HIT_RATE] == 180 / 360


def test_dimension_ties_rank_the_same_whatever_the_summation_order() -> None:
    from fleetlens.analytics.attribution.dimensions import Finding, rank_findings

    def finding(dimension: str, score: float) -> Finding:
        return Finding(dimension, "v", 2.4, 0.48, 0.9, 0.3, score)

    # The same score summed in two orders differs in its last bits.
    one, other = sum([0.1, 0.2, 0.3]), sum([0.3, 0.2, 0.1])
    assert one != other
    for a, b in ((one, other), (other, one)):
        ranked = rank_findings([finding("instance_id", a), finding("gpu_uuid", b)])
        assert [f.dimension for f in ranked] == ["gpu_uuid", "instance_id"]
