"""The capacity page over a data directory the analytics run analysed: what a user sees is
what the `capacity` tables hold (the page fits nothing)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import polars as pl
import pytest

from fleetlens.analytics.runner import publish, read_table, run
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, parquet_files
from tests.analytics.capacity_ramp import Ramp, write_ramp
from tests.dashboard.conftest import app_over
from tests.dashboard.test_availability import _values
from tests.dashboard.test_pages import frames, open_page

#: climbs to batch 40 only: its knee (about 100) is extrapolated
RAMP = Ramp(batches=tuple(np.linspace(1, 40, 40)))


@pytest.fixture(scope="module")
def analysed(tmp_path_factory: pytest.TempPathFactory) -> DataDir:
    root = DataDir(tmp_path_factory.mktemp("capacity-page") / "data")
    write_ramp(RAMP, root)
    run(root, notify=False)
    return root


def _chart(at, key: str) -> dict:  # noqa: ANN001
    return json.loads(next(ch for ch in at.get("plotly_chart") if key in ch.proto.id)
                      .proto.spec)


def test_the_page_draws_the_stored_curve_knee_and_operating_point(analysed, monkeypatch) -> None:
    at = open_page(app_over(analysed, monkeypatch), "capacity")
    stored = read_table(analysed, t.CAPACITY).row(0, named=True)
    assert at.title[0].value == "Capacity"
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Pools"] == "1"
    assert metrics["Least headroom"] == f"x{stored[c.HEADROOM_X]:.2f}"
    # the knee lies past the batches visited: the page says so
    assert any("extrapolated" in w.value for w in at.warning)
    curve = _chart(at, "cap_curve_0")
    lines = {v["x0"]: v for v in curve["layout"]["shapes"] if v.get("x0") == v.get("x1")}
    assert stored[c.KNEE_BATCH] in lines and stored[c.BATCH_NOW] in lines
    texts = [a["text"] for a in curve["layout"]["annotations"]]
    assert f"knee {stored[c.KNEE_BATCH]:.0f} (tpot)" in texts
    fit = next(tr for tr in curve["data"] if tr.get("name") == "TPOT p99 fit (extrapolated)")
    stored_curve = read_table(analysed, t.CAPACITY_CURVE)
    assert _values(fit["x"]) == stored_curve[c.BATCH].to_list()
    assert _chart(at, "cap_mbu")["data"][0]["type"] == "heatmap"
    (table,) = frames(at)
    assert table[c.KNEE_BATCH][0] == pytest.approx(stored[c.KNEE_BATCH])


def test_the_page_without_capacity_rows_says_so(analysed, tmp_path, monkeypatch) -> None:
    empty = DataDir(tmp_path / "data")
    write_ramp(Ramp(batches=(1.0, 2.0)), empty)  # data, but no analytics run
    at = open_page(app_over(empty, monkeypatch), "capacity")
    assert any("No capacity rows" in i.value for i in at.info)


def test_the_page_warns_when_the_stored_forecast_crosses_the_knee(analysed, tmp_path,
                                                                   monkeypatch) -> None:
    # the forecast columns as analytics stores them with prophet = true (the page reads them)
    root = DataDir(tmp_path / "data")
    shutil.copytree(analysed.root, root.root)
    table = read_table(root, t.CAPACITY)
    crossing = int(table[c.TS_NS][0]) + 10 * 3600 * 10**9
    table = table.with_columns(pl.lit(crossing).alias(c.CROSSING_NS),
                               pl.lit(123.4).alias(c.FORECAST_PEAK_RPS),
                               pl.lit(4).alias(c.GPUS_NEEDED))
    for path in parquet_files(root.table_dir(t.CAPACITY)):
        path.unlink()
    publish(root, t.CAPACITY, table, c.TS_NS)
    at = open_page(app_over(root, monkeypatch), "capacity")
    (warning,) = [w.value for w in at.warning if "forecast" in w.value]
    assert "peak 123.40 req/s" in warning and "about 4 more GPUs" in warning
    assert f"{(crossing // 10**9) % 86400 // 3600:02d}:" in warning
