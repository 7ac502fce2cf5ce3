"""The twin replays its own pool's requests: a pool is (service, model, GPU, TP,
configuration), so an instance whose configuration changed serves two pools, each with the
requests of its own windows."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import polars as pl

from fleetlens.analytics.capacity.analyse import analyse_capacity
from fleetlens.analytics.capacity.twin_data import pool_data
from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.published import publish
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir
from tests.analytics.capacity_ramp import T0, Ramp, ramp_tables

WINDOW_S = 60
NS = 10**9


def test_each_pool_replays_the_requests_of_its_own_configuration(tmp_path: Path) -> None:
    # one instance: config "aaa" for 20 windows, then a KV-cache change makes it "bbb"
    ramp = Ramp(batches=tuple(np.linspace(1, 60, 40)), instances=1)
    tables = ramp_tables(ramp)
    change = T0 + 20 * WINDOW_S * NS
    end = T0 + 40 * WINDOW_S * NS
    configs = pl.DataFrame({
        c.HOST_NAME: ["h01"] * 2, c.INSTANCE_ID: ["chat-h01-0"] * 2,
        c.MODEL: [ramp.model] * 2, c.CONFIG_FINGERPRINT: ["aaa", "bbb"],
        c.ENGINE_VERSION: ["0.11.0"] * 2, c.CONFIG_JSON: ["{}"] * 2,
        c.START_NS: [T0, change], c.END_NS: [change - 1, end]})
    tables = dataclasses.replace(tables, engine_configs=configs.lazy())
    found = analyse_capacity(tables, AnalyticsConfig(), WINDOW_S)
    root = DataDir(tmp_path / "data")
    publish(root, t.CAPACITY_WINDOWS, found.windows, c.WINDOW_START_NS)
    publish(root, t.REQUESTS, tables.requests.collect(), c.ARRIVAL_NS)
    publish(root, t.GPU_SAMPLES, tables.gpu_samples.collect(), c.TS_NS)
    seen = {}
    for row in found.capacity.iter_rows(named=True):
        data = pool_data(root, row, hours=24)
        assert data is not None
        seen[row[c.CONFIG]] = data.requests
    before, after = seen["aaa"], seen["bbb"]
    assert before.height > 0 and after.height > 0
    assert set(before[c.REQUEST_ID]).isdisjoint(after[c.REQUEST_ID])
    assert before.height + after.height == tables.requests.collect().height
    # each by the window its latencies describe: the change falls between them
    mid = pl.coalesce(pl.col(c.END_NS) - (pl.col(c.DECODE_S) * NS / 2).cast(pl.Int64),
                      pl.col(c.ARRIVAL_NS))
    assert before.select(mid.max()).item() < change <= after.select(mid.min()).item()
