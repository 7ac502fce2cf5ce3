"""Peer series: an instance against its siblings (analytics/peers.py), and the detector's
evidence rule, on the synthetic fleet."""

from __future__ import annotations

import dataclasses

import polars as pl

from fleetlens.analytics.analyse import analyse
from fleetlens.analytics.attribution import Tables
from fleetlens.analytics.peers import peer_metric, peer_series
from fleetlens.pipeline.schema import Cause
from fleetlens.pipeline.schema import columns as c
from tests.analytics.synthetic import NS, FleetSpec, Injected, generate

#: Three 8-GPU hosts, one TP1 instance per GPU: a straggler is 1 of 8 on its host.
SPEC = FleetSpec(hosts=3, gpus_per_host=8, rps_per_instance=1.0, duration_s=2 * 3600)
SLOW = Injected(Cause.SLOW_GPU, "gpu_uuid=GPU-00010003-0000-0000-0000-000000000043",
                start_s=5400, duration_s=900, magnitude=0.3)


def _tables(data) -> Tables:  # noqa: ANN001
    return Tables.from_frames(data.requests, data.engine_samples, data.gpu_samples,
                              data.windows, data.instance_gpus)


def test_a_straggler_stands_out_from_its_peers_and_a_surge_does_not() -> None:
    surge = Injected(Cause.TRAFFIC_SURGE, "service_name=chat", 3000, 600, magnitude=1.0)
    data = generate(SPEC, [SLOW, surge])
    series = peer_series(data.requests.lazy(), 60, ["tpot_p50_s"], min_requests=20).collect()
    assert set(series[c.METRIC]) == {peer_metric("tpot_p50_s")}
    rel = (pl.col(c.TS_NS) - SPEC.start_ns) // NS
    slow = series.filter(pl.col(c.SERIES).str.contains("h01/chat-3", literal=True))
    during = slow.filter(rel.is_between(5460, 6240))[c.VALUE]
    before = slow.filter(rel < 5400)[c.VALUE]
    assert during.median() > 1.18 and abs(before.median() - 1) < 0.05
    # the surge slows every instance alike (queueing): the ratios stay near 1
    in_surge = series.filter(rel.is_between(3060, 3540))[c.VALUE]
    assert abs(in_surge.median() - 1) < 0.05


def test_peer_series_find_a_single_gpu_straggler_the_host_series_miss(config) -> None:
    data = generate(SPEC, [SLOW])
    analysis = analyse(_tables(data), config)
    found = analysis.incidents
    on_h01 = found.filter((pl.col(c.HOST_NAME) == "h01")
                          & (pl.col(c.START_NS) < SPEC.start_ns + 6300 * NS)
                          & (pl.col(c.END_NS) > SPEC.start_ns + 5400 * NS))
    assert on_h01.height == 1, found
    top = analysis.causes.filter((pl.col(c.INCIDENT_ID) == on_h01[c.INCIDENT_ID][0])
                                 & (pl.col(c.RANK) == 1)).row(0, named=True)
    assert (top[c.CAUSE], top[c.SUBJECT]) == (Cause.SLOW_GPU, SLOW.subject)
    # before peer series (host-level series only) the 1-in-8 slowdown was not found
    blind = analyse(_tables(data), dataclasses.replace(config, peer_metrics=()),
                    attribute=False).incidents
    assert blind.filter(pl.col(c.HOST_NAME) == "h01").is_empty(), blind


def test_no_peer_series_without_three_peers() -> None:
    data = generate(dataclasses.replace(SPEC, hosts=1, gpus_per_host=2), [])
    assert peer_series(data.requests.lazy(), 60, ["tpot_p50_s"], 20).collect().is_empty()


def test_a_backlogged_instance_is_no_slower_per_prefill_token() -> None:
    # Random fleet 12001 (replayed bursts on 24 L4s): whichever instance the burst hit
    # queued for seconds, and its TTFT per token (TTFT holds the queue) stood out from its
    # peers 6-23x: 8 of 17 false incidents in the clean control. Prefill per token does not.
    data = generate(SPEC, [])
    rel = (pl.col(c.ARRIVAL_NS) - SPEC.start_ns) // NS
    backlog = (pl.col(c.INSTANCE_ID) == "h01/chat-3") & rel.is_between(5400, 6300)
    queued = data.requests.with_columns(
        pl.when(backlog).then(pl.col(c.QUEUE_S) + 5.0).otherwise(pl.col(c.QUEUE_S))
        .alias(c.QUEUE_S),
        pl.when(backlog).then(pl.col(c.TTFT_S) + 5.0).otherwise(pl.col(c.TTFT_S))
        .alias(c.TTFT_S),
    ).lazy()
    series = peer_series(queued, 60, ["prefill_per_token_p50_s", "ttft_per_token_p50_s"],
                         min_requests=20).collect()
    slow = series.filter(pl.col(c.SERIES).str.contains("h01/chat-3", literal=True)
                         & ((pl.col(c.TS_NS) - SPEC.start_ns) // NS).is_between(5460, 6240))
    by_metric = dict(slow.group_by(c.METRIC).agg(pl.col(c.VALUE).median()).iter_rows())
    assert by_metric[peer_metric("prefill_per_token_p50_s")] < 1.1
    assert by_metric[peer_metric("ttft_per_token_p50_s")] > 3  # what the old metric saw
