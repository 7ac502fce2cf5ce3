"""KV-cache, energy and leaderboard analyses on hand-made and synthetic frames."""

from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl
import pytest

from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.energy import idle_share, j_per_token, outliers
from fleetlens.analytics.hardware import ModelShape, model_shape
from fleetlens.analytics.kvcache import (
    kv_summary,
    preemption_episodes,
    prefix_hit_drops,
    usage_vs_latency,
)
from fleetlens.analytics.leaderboard import (
    best_under_sla,
    entropy_weights,
    leaderboard,
    pareto,
    prepare,
)
from fleetlens.pipeline.schema import columns as c
from tests.analytics.synthetic import FleetSpec, Injected, generate

from .conftest import NS, T0


def _engine(preempt: list[float], hits: list[float], queries: list[float], kv: list[float],
            instance: str = "h01/chat/0") -> pl.DataFrame:
    n = len(kv)
    return pl.DataFrame({
        c.TS_NS: [T0 + i * 10 * NS for i in range(n)], c.HOST_NAME: "h01",
        c.INSTANCE_ID: instance, c.MODEL: "llama-3.1-8b", c.KV_CACHE_USAGE: kv,
        c.NUM_RUNNING: [1.0] * n, c.NUM_WAITING: [0.0] * n, c.PREEMPTIONS_TOTAL: preempt,
        c.PREFIX_CACHE_QUERIES_TOTAL: queries, c.PREFIX_CACHE_HITS_TOTAL: hits,
        c.PROMPT_TOKENS_TOTAL: queries, c.GENERATION_TOKENS_TOTAL: queries,
    })


def test_kv_capacity_from_model_shape() -> None:
    shape = model_shape("meta-llama/Llama-3.1-8B-Instruct", AnalyticsConfig())
    assert shape == ModelShape(8.03, 32, 8, 128)
    assert shape.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2  # 131072 B = 128 KiB
    cfg = dataclasses.replace(AnalyticsConfig(), model_shapes={"tiny": "0.001,2,1,32,2"})
    assert model_shape("tiny", cfg).kv_bytes_per_token == 256


def test_kv_summary_counts_preemptions_across_a_reset() -> None:
    # counter 0,5,10 then a restart (0) then 3: 10 + 3 = 13 preemptions
    eng = _engine([0, 5, 10, 0, 3], [0, 50, 100, 100, 130], [0, 100, 200, 200, 300],
                  [0.5, 0.9, 1.0, 0.2, 0.4])
    row = kv_summary(eng, gpu_model={"h01": "H100"}).row(0, named=True)
    assert row[c.PREEMPTIONS] == 13
    assert row[c.PREFIX_HIT_RATE] == pytest.approx(130 / 300)
    assert row["kv_usage_max"] == 1.0
    assert row[c.KV_HEADROOM] == pytest.approx(1 - np.quantile([0.5, 0.9, 1.0, 0.2, 0.4], 0.95))
    # one H100 (80 GB x 0.9) minus 16 GB of weights, over 128 KiB per token: ~427k tokens
    assert row["kv_capacity_tokens"] == pytest.approx((72e9 - 8.03e9 * 2) / 131072)


def test_preemption_episodes_and_hit_rate_drops() -> None:
    pre = [0, 0, 4, 9, 9, 9, 9, 9, 9, 9, 12, 12]
    eng = _engine(pre, [0] * 12, [0] * 12, [0.5] * 12)
    episodes = preemption_episodes(eng, gap_s=30)
    assert episodes[c.PREEMPTIONS].to_list() == [9, 3]
    queries = np.arange(0, 60 * 100, 100, dtype=float)
    rates = [0.6] * 40 + [0.05] * 20
    hits = np.concatenate([[0], np.cumsum(np.diff(queries) * np.array(rates[1:]))])
    eng = _engine([0] * 60, list(hits), list(queries), [0.5] * 60)
    drops = prefix_hit_drops(eng, window_s=60, lookback=10)
    assert drops.filter(pl.col("drop"))[c.WINDOW_START_NS].min() >= T0 + 360 * NS
    assert drops.filter(pl.col("drop")).height >= 2


def test_usage_vs_latency_correlates_full_cache_with_waiting() -> None:
    data = generate(FleetSpec(hosts=2, duration_s=2 * 3600, seed=3),
                    [Injected("kv_cache_pressure", "host_name=h01", 3600, 1800)])
    out = usage_vs_latency(data.engine_samples, data.requests)
    h01 = out.filter(pl.col(c.INSTANCE_ID).str.starts_with("h01"))
    assert (h01["corr_usage_queue"] > 0.5).all()


def _energy(requests: pl.DataFrame, slow_host: str, factor: float) -> pl.DataFrame:
    base = pl.when(pl.col(c.HOST_NAME) == slow_host).then(factor).otherwise(1.0)
    return requests.select(
        c.REQUEST_ID, c.HOST_NAME,
        (pl.col(c.OUTPUT_TOKENS) * 0.1 * base).alias(c.ENERGY_J),
        (0.1 * base).alias(c.J_PER_TOKEN), pl.lit(1.0).alias(c.ATTRIBUTION_COVERAGE))


def test_j_per_token_idle_share_and_outliers() -> None:
    data = generate(FleetSpec(hosts=6, gpus_per_host=1, duration_s=1800, seed=4))
    energy = _energy(data.requests, "h03", 1.6)
    per_host = j_per_token(data.requests, energy, [c.MODEL, c.HOST_NAME], window_s=None)
    h03 = per_host.filter(pl.col(c.HOST_NAME) == "h03")[c.J_PER_TOKEN].item()
    assert h03 == pytest.approx(0.16) and per_host[c.J_PER_TOKEN].min() == pytest.approx(0.1)
    over_time = j_per_token(data.requests, energy, [c.MODEL], window_s=600)
    assert over_time.height == 3
    found = outliers(per_host, c.HOST_NAME, [c.MODEL])
    assert found[c.HOST_NAME].to_list() == ["h03"]
    gwe = pl.DataFrame({c.HOST_NAME: ["a", "a", "b"], c.MEASURED_J: [100.0, 100.0, 50.0],
                        c.ATTRIBUTED_J: [80.0, 60.0, 50.0], c.IDLE_J: [20.0, 40.0, 0.0]})
    shares = dict(idle_share(gwe).select(c.HOST_NAME, c.IDLE_SHARE).iter_rows())
    assert shares == {"a": 0.3, "b": 0.0}
    with pytest.raises(ValueError, match="no column"):
        j_per_token(data.requests, energy, ["nope"])


def test_j_per_token_tells_apart_requests_sharing_an_id() -> None:
    # vLLM's n > 1 choices: two spans, one gen_ai.request.id; each has its own energy row.
    requests = pl.DataFrame({
        c.REQUEST_ID: ["r1", "r1", "r2"], c.TRACE_ID: ["t1", "t2", "t3"],
        c.SPAN_ID: ["s1", "s2", "s3"], c.ARRIVAL_NS: [T0, T0, T0], c.OUTPUT_TOKENS: [10, 10, 10],
        c.MODEL: ["m", "m", "m"]})
    energy = requests.select(c.REQUEST_ID, c.TRACE_ID, c.SPAN_ID).with_columns(
        pl.Series(c.ENERGY_J, [1.0, 2.0, 3.0]), pl.lit(1.0).alias(c.ATTRIBUTION_COVERAGE))
    out = j_per_token(requests, energy, [c.MODEL], window_s=None)
    assert out[c.REQUESTS].item() == 3 and out[c.ENERGY_J].item() == pytest.approx(6.0)
    # request_energy without the span (written by an older pipeline) still joins on the id
    old = j_per_token(requests.filter(pl.col(c.REQUEST_ID) == "r2"),
                      energy.drop(c.TRACE_ID, c.SPAN_ID), [c.MODEL], window_s=None)
    assert old[c.ENERGY_J].item() == pytest.approx(3.0)


def test_pareto_and_entropy_weights() -> None:
    frame = pl.DataFrame({"ttft_p99_s": [0.1, 0.2, 0.3], c.J_PER_TOKEN: [0.3, 0.2, 0.4]})
    assert pareto(frame, ["ttft_p99_s", c.J_PER_TOKEN]) == [True, True, False]
    norm = np.array([[1.0, 0.5], [0.0, 0.5], [0.5, 0.5]])
    weights = entropy_weights(norm)
    assert weights[0] > 0.99 and weights[1] < 0.01  # a constant metric carries no weight


@pytest.fixture(scope="module")
def board_input():
    fast = generate(FleetSpec(hosts=2, gpus_per_host=2, duration_s=1800, seed=1,
                              gpu_model="H200"))
    slow = generate(FleetSpec(hosts=2, gpus_per_host=2, duration_s=1800, seed=2,
                              gpu_model="A100", model="llama-3.1-8b"),
                    [Injected("slow_gpu", "host_name=h00", 0, 1800),
                     Injected("slow_gpu", "host_name=h01", 0, 1800)])
    reqs = pl.concat([
        fast.requests.with_columns(pl.concat_str(pl.lit("f"), c.INSTANCE_ID)
                                   .alias(c.INSTANCE_ID), pl.lit("llama-3.1-8b").alias(c.MODEL)),
        slow.requests.with_columns(pl.concat_str(pl.lit("s"), c.INSTANCE_ID)
                                   .alias(c.INSTANCE_ID),
                                   pl.concat_str(pl.lit("s"), c.REQUEST_ID).alias(c.REQUEST_ID)),
    ])
    mapping = pl.concat([
        fast.instance_gpus.with_columns(pl.concat_str(pl.lit("f"), c.INSTANCE_ID)
                                        .alias(c.INSTANCE_ID)),
        slow.instance_gpus.with_columns(pl.concat_str(pl.lit("s"), c.INSTANCE_ID)
                                        .alias(c.INSTANCE_ID)),
    ])
    energy = reqs.select(c.REQUEST_ID, (pl.col(c.OUTPUT_TOKENS) * pl.when(
        pl.col(c.GPU_MODEL) == "H200").then(0.08).otherwise(0.2)).alias(c.ENERGY_J))
    return prepare(reqs, mapping, fast.gpu_samples, energy)


def test_leaderboard_ranks_the_faster_cheaper_config_first(board_input) -> None:
    cfg = dataclasses.replace(AnalyticsConfig(), bootstrap_samples=30)
    board = leaderboard(board_input, cfg)
    assert board[c.GPU_MODEL].to_list() == ["H200", "A100"]
    top = board.row(0, named=True)
    assert top[c.RANK] == 1 and top[c.RANK_LO] == 1 and top[c.RANK_HI] == 1
    assert top[c.PARETO] and not board.row(1, named=True)[c.PARETO]
    assert top[c.J_PER_TOKEN] == pytest.approx(0.08)
    assert top[c.CONFIG] == "tp=1"
    assert 0 < top[c.MEM_BW_UTIL] <= 1
    best = best_under_sla(board, {"ttft_p99_s": 10.0})
    assert best[c.GPU_MODEL] == "H200"
    assert best_under_sla(board, {"tpot_p99_s": 1e-6}) is None
    with pytest.raises(ValueError, match="not a leaderboard column"):
        best_under_sla(board, {"bogus": 1.0})


def test_leaderboard_like_for_like_buckets(board_input) -> None:
    cfg = dataclasses.replace(AnalyticsConfig(), bootstrap_samples=10)
    board = leaderboard(board_input, cfg, by_bucket=True)
    for _, rows in board.group_by(c.PROMPT_BUCKET):
        assert sorted(rows[c.RANK].to_list()) == list(range(1, rows.height + 1))
    assert board[c.PROMPT_BUCKET].n_unique() >= 3
