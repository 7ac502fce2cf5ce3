"""Reading derived hour partitions: column projection and the per-call cache."""

from __future__ import annotations

import polars as pl
from polars.testing import assert_frame_equal

from fleetlens.pipeline.partitions import HOUR_NS, partition_file, publish, read_hours
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir
from tests.pipeline.rawdata import T0


def _samples(hour: int, n: int) -> pl.DataFrame:
    empty = t.table(t.GPU_SAMPLES).empty()
    rows = pl.DataFrame({c.HOST_NAME: ["h1"] * n, c.GPU_UUID: ["g"] * n,
                         c.TS_NS: [hour + k for k in range(n)],
                         c.POWER_W: [1.0 * k for k in range(n)]})
    return pl.concat([empty, rows], how="diagonal_relaxed").select(empty.columns)


def test_read_hours_projects_columns_and_reuses_cached_partitions(tmp_path) -> None:
    dd = DataDir(tmp_path)
    hour = T0 - T0 % HOUR_NS
    publish(dd, t.GPU_SAMPLES, hour, _samples(hour, 3))
    publish(dd, t.GPU_SAMPLES, hour + HOUR_NS, _samples(hour + HOUR_NS, 2))
    hours = [hour - HOUR_NS, hour, hour + HOUR_NS]  # the first one does not exist
    full = read_hours(dd, t.GPU_SAMPLES, hours)
    cols = [c.HOST_NAME, c.TS_NS]
    assert_frame_equal(read_hours(dd, t.GPU_SAMPLES, hours, cols), full.select(cols))
    cache: dict = {}
    assert_frame_equal(read_hours(dd, t.GPU_SAMPLES, hours, cache=cache), full)
    assert len(cache) == 2
    partition_file(dd, t.GPU_SAMPLES, hour).unlink()  # served from the cache now
    assert_frame_equal(read_hours(dd, t.GPU_SAMPLES, hours, cache=cache), full)
    assert read_hours(dd, t.GPU_SAMPLES, [hour - HOUR_NS], cols).columns == cols
