"""KV capacity: vLLM's own figure (vllm:cache_config_info, forwarded by the agent into
engine_samples.kv_capacity_tokens) wins over the model-table estimate wherever it exists."""

from __future__ import annotations

import polars as pl
import pytest

from fleetlens.analytics.kvcache import SOURCE_ESTIMATE, SOURCE_VLLM, kv_summary
from fleetlens.pipeline.schema import columns as c

NS = 1_000_000_000
T0 = 1_700_000_000 * NS


def _engine(instance: str, model: str, capacity: list[float | None]) -> pl.DataFrame:
    n = len(capacity)
    return pl.DataFrame({
        c.TS_NS: [T0 + i * NS for i in range(n)], c.HOST_NAME: "h01", c.INSTANCE_ID: instance,
        c.MODEL: model, c.KV_CACHE_USAGE: [0.5] * n, c.NUM_RUNNING: [1.0] * n,
        c.NUM_WAITING: [0.0] * n, c.PREEMPTIONS_TOTAL: [0.0] * n,
        c.PREFIX_CACHE_QUERIES_TOTAL: [0.0] * n, c.PREFIX_CACHE_HITS_TOTAL: [0.0] * n,
        c.PROMPT_TOKENS_TOTAL: [0.0] * n, c.GENERATION_TOKENS_TOTAL: [0.0] * n,
        c.KV_CAPACITY_TOKENS: pl.Series(capacity, dtype=pl.Float64),
    })


def test_reported_capacity_wins_and_the_estimate_fills_in() -> None:
    engine = pl.concat([
        # a model no table knows: only vLLM's figure can give its capacity
        _engine("h01/custom", "acme/unlisted-model", [None, 32768 * 128, 32768 * 128]),
        # known model, and vLLM reports: vLLM's figure, not the 0.9 x memory guess
        _engine("h01/llama", "meta-llama/Llama-3.1-8B-Instruct", [250_000.0] * 2),
        _engine("h01/old", "meta-llama/Llama-3.1-8B-Instruct", [None, None]),  # older agent
    ])
    rows = {r[c.INSTANCE_ID]: r for r in
            kv_summary(engine, gpu_model={"h01": "H100"}).iter_rows(named=True)}
    assert rows["h01/custom"][c.KV_CAPACITY_TOKENS] == 32768 * 128
    assert rows["h01/custom"]["kv_capacity_source"] == SOURCE_VLLM
    assert rows["h01/llama"][c.KV_CAPACITY_TOKENS] == 250_000.0
    assert rows["h01/old"][c.KV_CAPACITY_TOKENS] == pytest.approx((72e9 - 8.03e9 * 2) / 131072)
    assert rows["h01/old"]["kv_capacity_source"] == SOURCE_ESTIMATE


def test_engine_samples_without_the_column_still_estimate() -> None:
    engine = _engine("h01/old", "meta-llama/Llama-3.1-8B-Instruct", [None]).drop(
        c.KV_CAPACITY_TOKENS)
    row = kv_summary(engine, gpu_model={"h01": "H100"}).row(0, named=True)
    assert row["kv_capacity_source"] == SOURCE_ESTIMATE
