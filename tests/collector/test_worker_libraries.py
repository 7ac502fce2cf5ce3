"""Collector workers do not load pyarrow's filesystem bindings (S3, GCS, Azure, HDFS), which
``import pyarrow.parquet`` pulls in through ``pyarrow.fs`` and a worker never uses
(``libarrow_s3`` alone is 3.6 MiB of RSS per worker), and still store what they accept.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetlens.collector.testing import running_collector, vllm_trace_request
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, scan


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(x) for x in (task / "children").read_text().split()]
    return found


@pytest.mark.parametrize("workers", [1, 2])
def test_workers_map_no_arrow_filesystem_libraries(tmp_path: Path, workers: int) -> None:
    data = tmp_path / "data"
    with running_collector(data, workers=workers,
                           config={"flush_rows": 100, "self_metrics_address": ""}) as col:
        for i in range(3):
            col.export(vllm_trace_request(120, seed=i))
        pids = _children(col.pid) if workers > 1 else [col.pid]
        assert len(pids) == workers
        for pid in pids:
            maps = Path(f"/proc/{pid}/maps").read_text()
            assert "libparquet" in maps  # the probe is real: this process writes Parquet
            assert "libarrow_s3" not in maps, pid
        assert col.stop() == 0
    assert scan(DataDir(data), t.SPANS).collect().height == 360
