"""The exporter's capacity series, scraped as Prometheus scrapes them: headroom, the rate at
the knee, goodput per GPU (at the knee and now), MBU and MFU per pool equal the `capacity`
row the analytics run stored (issue 31: "exporter gauges (headroom, goodput)")."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.exporter import DerivedSignals
from fleetlens.analytics.runner import read_table, run
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import exported as x
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir
from tests.analytics.capacity_ramp import Ramp, write_ramp


def _scrape(root: DataDir) -> dict[str, list]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DerivedSignals(root, refresh_s=0))
    text = generate_latest(registry).decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_each_pool_s_headroom_goodput_and_utilisation_are_the_stored_row(tmp_path) -> None:
    root = DataDir(tmp_path / "data")
    write_ramp(Ramp(batches=tuple(np.linspace(1, 140, 40))), root)
    assert _scrape(root)[x.CAPACITY_HEADROOM] == []  # no analytics run yet: no pool
    run(root, AnalyticsConfig(), notify=False)
    stored = read_table(root, t.CAPACITY).row(0, named=True)
    got = _scrape(root)
    pool = {"service": stored[c.SERVICE_NAME], "model": stored[c.MODEL],
            "gpu_model": stored[c.GPU_MODEL], "tp": str(stored[c.TP]),
            "config": stored[c.CONFIG]}
    for family, column in ((x.CAPACITY_HEADROOM, c.HEADROOM_X), (x.CAPACITY_KNEE_RPS,
                           c.KNEE_RPS), (x.CAPACITY_MBU, c.MBU), (x.CAPACITY_MFU, c.MFU)):
        samples = got[family]
        assert [s.labels for s in samples] == [pool], family
        assert samples[0].value == pytest.approx(stored[column]), family
    goodput = {s.labels[x.GOODPUT_AT]: s.value for s in got[x.CAPACITY_GOODPUT]}
    assert goodput == pytest.approx({"knee": stored[c.GOODPUT_RPS_PER_GPU],
                                     "now": stored[c.GOODPUT_NOW_RPS_PER_GPU]})
    assert stored[c.KNEE_RPS] > 0 and stored[c.HEADROOM_X] > 0
