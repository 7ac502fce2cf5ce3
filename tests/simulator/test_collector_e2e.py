"""simulator -> real collector (subprocess) -> raw ``spans`` / ``metric_points`` Parquet rows."""

from __future__ import annotations

import time
from pathlib import Path

import polars as pl
import pytest

from fleetlens.collector.testing import running_collector
from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, scan
from fleetlens.simulator import parse_scenario, run
from tests.simulator.test_simulate import small


@pytest.mark.e2e
def test_simulated_fleet_lands_in_the_collectors_tables(tmp_path: Path) -> None:
    data = DataDir(tmp_path / "data")
    scenario = parse_scenario(small(duration=90.0))
    start_ns = (time.time_ns() // 10**9 - 3600) * 10**9  # within the collector's clock skew
    with running_collector(data.root) as collector:
        stale = run(scenario, collector.grpc_address, seed=1)  # [fleet].start is months old
        result = run(scenario, collector.grpc_address, start_ns=start_ns)
        assert collector.stop() == 0
    # the SDK exporter drops the response: the simulator reads partial successes itself
    assert stale.exported.spans_rejected == stale.spans and stale.exported.spans_sent == 0
    assert "from now" in stale.exported.last_rejection
    assert result.exported.spans_failed == result.exported.spans_rejected == 0
    assert result.exported.points_failed == result.exported.points_rejected == 0
    spans = scan(data, t.SPANS).collect()
    points = scan(data, t.METRIC_POINTS).collect()
    # at-least-once delivery: deduplicate on the table key before counting
    spans = spans.unique([c.TRACE_ID, c.SPAN_ID])
    assert spans.height == result.spans
    llm = spans.filter(pl.col(c.NAME) == a.VLLM_REQUEST_SPAN)
    assert llm.height == result.finished
    assert llm[c.KIND].unique().to_list() == [2]
    assert set(llm[c.HOST_NAME].unique()) == {"h01", "h02"}
    assert llm[c.SERVICE_NAME].unique().to_list() == ["chat"]
    assert llm[c.GEN_AI_PROMPT_TOKENS].min() >= 1 and llm[c.GEN_AI_E2E_S].min() > 0
    e2e = (llm[c.END_NS] - llm[c.START_NS]) / 1e9
    assert ((e2e - llm[c.GEN_AI_E2E_S]).abs() < 1e-6).all()
    gateway = spans.filter(pl.col(c.NAME) == a.GATEWAY_SPAN)
    assert set(gateway[c.SPAN_ID]) == set(llm[c.PARENT_SPAN_ID].drop_nulls()) - {""}
    names = set(points[c.METRIC_NAME].unique())
    assert {a.HW_ENERGY, a.HW_POWER, a.GPU_CLOCK_SM, a.ENGINE_KV_CACHE_USAGE,
            a.ENGINE_GENERATION_TOKENS, a.ENGINE_INSTANCE_GPUS} <= names
    energy = points.filter(pl.col(c.METRIC_NAME) == a.HW_ENERGY)
    assert energy[c.HOST_NAME].n_unique() == 2 and energy[c.VALUE].min() > 0


@pytest.mark.e2e
def test_a_token_opens_a_collector_that_requires_one(tmp_path: Path) -> None:
    scenario = parse_scenario(small(duration=20.0))
    start_ns = (time.time_ns() // 10**9 - 600) * 10**9
    with running_collector(tmp_path / "data", config={"auth_tokens": ["s3cret"]}) as col:
        refused = run(scenario, col.grpc_address, start_ns=start_ns)
        accepted = run(scenario, col.grpc_address, start_ns=start_ns, token="s3cret")
        assert col.stop() == 0
    assert refused.exported.spans_sent == 0 and refused.exported.spans_failed == refused.spans
    assert accepted.exported.spans_sent == accepted.spans > 0
    assert accepted.exported.spans_failed == accepted.exported.spans_rejected == 0
