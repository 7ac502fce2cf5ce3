"""Each attribution step on hand-made requests with a known answer."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from fleetlens.analytics.attribution.dimensions import add_buckets, compare_dimensions
from fleetlens.analytics.attribution.phases import phase_split
from fleetlens.pipeline.schema import columns as c

from .conftest import NS, T0


def _requests(n: int, *, queue=0.05, prefill=0.1, tpot=0.02, out=101, overhead=0.01,
              hosts=("h01", "h02", "h03", "h04"), input_tokens=500, cached=0):
    decode = tpot * (out - 1)
    e2e = queue + prefill + decode + overhead
    return pl.DataFrame({
        c.HOST_NAME: [hosts[i % len(hosts)] for i in range(n)],
        c.ARRIVAL_NS: [T0 + i * NS for i in range(n)],
        c.QUEUE_S: np.full(n, queue), c.PREFILL_S: np.full(n, prefill),
        c.DECODE_S: np.full(n, decode), c.OVERHEAD_S: np.full(n, overhead),
        c.E2E_S: np.full(n, e2e), c.TTFT_S: np.full(n, queue + prefill),
        c.TPOT_S: np.full(n, tpot), c.OUTPUT_TOKENS: np.full(n, out),
        c.INPUT_TOKENS: np.full(n, input_tokens), c.CACHED_TOKENS: np.full(n, cached),
    })


def test_phase_split_finds_the_queue() -> None:
    base = _requests(200)
    inc = _requests(100, queue=0.55)
    split = phase_split(inc, base)
    assert split.excess_s["queue"] == pytest.approx(0.5)
    assert split.share["queue"] == pytest.approx(1.0)
    assert split.dominant() == "queue"
    assert sum(split.share.values()) == pytest.approx(1.0)


def test_phase_split_per_token_decode_ignores_longer_answers() -> None:
    base = _requests(200, out=101)
    longer = _requests(100, out=401)  # 4x the tokens at the same speed: no decode excess
    assert phase_split(longer, base).excess_s["decode"] == pytest.approx(0.0, abs=1e-9)
    slower = _requests(100, tpot=0.03)  # 10 ms/token slower x 100 tokens = +1 s
    split = phase_split(slower, base)
    assert split.excess_s["decode"] == pytest.approx(1.0)
    assert split.dominant() == "decode"


def test_phase_split_mixed_shares() -> None:
    split = phase_split(_requests(100, queue=0.35, prefill=0.2), _requests(100))
    assert split.share["queue"] == pytest.approx(0.75)
    assert split.share["prefill"] == pytest.approx(0.25)


def test_phase_split_counts_network_as_overhead() -> None:
    base = _requests(100).with_columns(pl.lit(0.01).alias(c.NETWORK_S))
    inc = _requests(100).with_columns(pl.lit(0.31).alias(c.NETWORK_S))
    split = phase_split(inc, base)
    assert split.excess_s["network"] == pytest.approx(0.3)
    assert split.excess_s["engine_overhead"] == pytest.approx(0.0)
    assert split.dominant() == "overhead"


def test_dimension_comparison_points_at_the_slow_host() -> None:
    base = _requests(400)
    fast = _requests(300, hosts=("h01", "h02", "h03"))
    slow = _requests(100, hosts=("h04",), tpot=0.05)
    findings = compare_dimensions(pl.concat([fast, slow]), base, "e2e_p99_s", [c.HOST_NAME])
    top = findings[0]
    assert (top.dimension, top.value) == (c.HOST_NAME, "h04")
    assert top.slow_share == pytest.approx(1.0)
    assert top.baseline_share == pytest.approx(0.25)
    assert top.lift == pytest.approx(1.01 / 0.26)
    assert top.share_of_excess == pytest.approx(1.0, abs=0.01)
    assert all(f.score == 0 for f in findings[1:] if f.dimension == c.HOST_NAME)


def test_dimension_comparison_finds_prompt_and_cache_buckets() -> None:
    base = _requests(400, input_tokens=500, cached=300)
    normal = _requests(300, input_tokens=500, cached=300)
    long = _requests(100, input_tokens=9000, cached=0, prefill=1.5)
    findings = compare_dimensions(pl.concat([normal, long]), base, "ttft_p99_s", [])
    tops = {(f.dimension, f.value) for f in findings[:2]}
    assert tops == {(c.PROMPT_BUCKET, "8192-32768"), (c.CACHED_RATIO_BUCKET, "<0.25")}


def test_buckets() -> None:
    frame = pl.DataFrame({c.INPUT_TOKENS: [10, 600, 40000], c.OUTPUT_TOKENS: [1, 200, 3000],
                          c.CACHED_TOKENS: [0, 300, 39000]})
    out = add_buckets(frame)
    assert out[c.PROMPT_BUCKET].to_list() == ["<128", "512-2048", ">=32768"]
    assert out[c.OUTPUT_BUCKET].to_list() == ["<32", "128-512", ">=2048"]
    assert out[c.CACHED_RATIO_BUCKET].to_list() == ["<0.25", "0.50-0.75", ">=0.75"]


def test_no_requests_no_findings() -> None:
    assert compare_dimensions(_requests(0), _requests(10), "e2e_p99_s", [c.HOST_NAME]) == []
