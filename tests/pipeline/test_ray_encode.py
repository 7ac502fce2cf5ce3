"""The Ray runner's tasks encode partitions and its driver writes the bytes: the files must be
those :func:`pipeline.partitions.publish` writes for the same frame, an empty frame removing
the partition as publish does. No cluster needed: these are the functions the tasks and the
driver call."""

from __future__ import annotations

import polars as pl
import pytest

pytest.importorskip("ray")

from fleetlens.pipeline.config import PipelineConfig  # noqa: E402
from fleetlens.pipeline.partitions import existing_hours, partition_file, publish  # noqa: E402
from fleetlens.pipeline.ray_runner import _write, encode  # noqa: E402
from fleetlens.pipeline.runner import OUTPUTS, Pipeline  # noqa: E402
from fleetlens.pipeline.storage import DataDir  # noqa: E402
from tests.pipeline.fleet import make_fleet, write_batches  # noqa: E402


def test_encoded_bytes_are_the_published_files(tmp_path) -> None:
    """Every partition of a local run, read back, then published and encoded + written: the
    same bytes, table by table (categorical, list and struct columns included)."""
    source = DataDir(tmp_path / "source")
    write_batches(source, make_fleet(seed=3, seconds=900))
    Pipeline(source, PipelineConfig()).run_once()
    published, written = DataDir(tmp_path / "published"), DataDir(tmp_path / "written")
    compared = set()
    for table in OUTPUTS:
        for hour in existing_hours(source, table):
            frame = pl.read_parquet(partition_file(source, table, hour))
            rows = publish(published, table, hour, frame)
            part = encode(table, frame)
            assert (part.table, part.rows) == (table, rows) and rows > 0
            assert _write(written, hour, part) == rows
            assert (partition_file(written, table, hour).read_bytes()
                    == partition_file(published, table, hour).read_bytes())
            compared.add(table)
    assert compared == set(OUTPUTS)


def test_an_empty_partition_is_removed_as_publish_removes_it(tmp_path) -> None:
    """A task's empty frame comes back without bytes, and writing it removes the hour's
    partition (an hour that lost its rows), as publish does."""
    dd = DataDir(tmp_path / "data")
    hour = 3600 * 10**9 * 500_000
    frame = pl.DataFrame({"x": [1, 2, 3]})
    publish(dd, OUTPUTS[0], hour, frame)
    path = partition_file(dd, OUTPUTS[0], hour)
    assert path.exists()
    part = encode(OUTPUTS[0], frame.clear())
    assert part.rows == 0 and part.body is None
    assert _write(dd, hour, part) == 0
    assert not path.exists()
    assert _write(dd, hour, part) == 0  # nothing there: still fine
