"""The collector's memory footprint: its processes never load Polars or pandas, and the
supervisor loads no Arrow either (each library costs tens of MiB of RSS per process; see
docs/collector.md).

Checked twice: by importing the entry modules in a fresh interpreter, and in the shared
libraries mapped by a real collector with two workers after it has stored spans.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from fleetlens.collector.signals import SIGNALS, arrow_schema
from fleetlens.collector.testing import running_collector, vllm_trace_request
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, scan

REPO = Path(__file__).resolve().parents[2]


def _loaded(code: str) -> set[str]:
    """Which of polars/pandas/pyarrow/grpc a fresh interpreter imported after ``code``."""
    probe = (f"import sys\n{code}\nprint(' '.join(m for m in ('polars', 'pandas', 'pyarrow', "
             "'grpc') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True,
                         text=True, check=True, timeout=120)
    return set(out.stdout.split())


def test_supervisor_entry_imports_neither_polars_nor_arrow() -> None:
    loaded = _loaded("from fleetlens.cli import main\nimport collector.cli, collector.supervisor")
    assert not loaded & {"polars", "pandas", "pyarrow"}


def test_worker_decodes_and_writes_parquet_without_polars(tmp_path) -> None:
    code = f"""
import time
from fleetlens.collector.config import CollectorConfig
from fleetlens.collector.ingest import Ingest
from fleetlens.collector.signals import SPANS
from fleetlens.collector.sink import Segments, Sink
from fleetlens.collector.telemetry import Telemetry
from fleetlens.collector.testing import vllm_trace_request
from fleetlens.collector.wal import Wal
from fleetlens.collector import worker
from fleetlens.pipeline.storage import DataDir
worker.keep_out_pandas()  # what run_worker does first
data, telemetry = DataDir({str(tmp_path)!r}), Telemetry()
sink = Sink(Segments(data, 'w'), Wal(data.wal, 'w'), telemetry, flush_rows=10,
            flush_interval_s=60.0, max_buffered_bytes=1 << 26)
ingest = Ingest(CollectorConfig(), sink, telemetry)
ingest.export(SPANS, vllm_trace_request(20, seed=1).SerializeToString())
assert sink.flush()
sink.close()
"""
    loaded = _loaded(code)
    assert not loaded & {"polars", "pandas"}
    assert {"pyarrow", "grpc"} <= loaded  # the probe did import what a worker runs on
    assert scan(DataDir(tmp_path), t.SPANS).collect().height == 20


def test_arrow_schemas_equal_what_polars_would_write() -> None:
    for signal in SIGNALS:
        table = t.RAW_SIGNALS[signal.folder]
        expected = t.table(table).empty().to_arrow().schema
        assert arrow_schema(table).equals(expected, check_metadata=True), table
        assert signal.arrow_schema.equals(expected)
    assert arrow_schema(t.METRIC_POINTS).field("bucket_counts").type == pa.large_list(pa.int64())


def test_without_keep_out_arrow_would_load_pandas() -> None:
    # The reason for keep_out_pandas: a plain Table.from_pydict imports pandas when present.
    probe = "import pyarrow as pa\npa.Table.from_pydict({'x': [1]})"
    assert "pandas" in _loaded(probe)
    kept = _loaded("from collector.worker import keep_out_pandas\nkeep_out_pandas()\n" + probe)
    assert "pandas" not in kept and "pyarrow" in kept


def _tree(pid: int) -> list[int]:
    found, stack = [], [pid]
    while stack:
        p = stack.pop()
        found.append(p)
        for task in Path(f"/proc/{p}/task").iterdir():
            stack += [int(x) for x in (task / "children").read_text().split()]
    return found


def _mapped(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.e2e
def test_running_collector_processes_map_no_polars(tmp_path) -> None:
    data = tmp_path / "data"
    with running_collector(data, workers=2, config={"flush_rows": 100}) as col:
        for i in range(4):
            col.export(vllm_trace_request(150, seed=i))
        supervisor, workers = col.pid, _tree(col.pid)[1:]
        # forked workers and nothing else: no multiprocessing resource tracker (~12 MiB)
        assert len(workers) == 2
        assert all("pyarrow" in _mapped(p) for p in workers)  # each writes Parquet
        assert "polars" not in _mapped(supervisor)
        assert "pyarrow" not in _mapped(supervisor) and "libarrow" not in _mapped(supervisor)
        for pid in workers:
            assert "polars" not in _mapped(pid) and "pandas" not in _mapped(pid), pid
            # numpy's core library: pyarrow imports numpy if it can (about 11 MiB per worker)
            assert "_multiarray_umath" not in _mapped(pid), pid
        assert col.stop() == 0
    assert scan(DataDir(data), t.SPANS).collect().height == 600


_ARENAS_PROBE = """
import ctypes, os, sys, tempfile, threading
from fleetlens.collector.supervisor import prepare_worker
prepare_worker()  # what a worker process does before anything else
import pyarrow as pa, pyarrow.parquet  # noqa: what a worker runs on
def work():  # threads that allocate, as gRPC's and the flusher do
    kept = [bytes(600 + i % 400) for i in range(2000)]
    pa.Table.from_pydict({"x": list(range(1000))})
    del kept
threads = [threading.Thread(target=work) for _ in range(6)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
libc = ctypes.CDLL("libc.so.6")
libc.fopen.restype = ctypes.c_void_p
path = os.path.join(tempfile.mkdtemp(), "malloc.xml")
handle = ctypes.c_void_p(libc.fopen(path.encode(), b"w"))
libc.malloc_info(0, handle)
libc.fclose(handle)
print(open(path).read().count("<heap "), "numpy" in sys.modules)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc_info")
def test_a_worker_has_one_malloc_arena_and_no_numpy() -> None:
    # The cap must be set before ``import pyarrow`` starts its threads: set after it (as
    # before issue 34's fix), every worker had a second arena holding 20-30 MiB of its heap.
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    out = subprocess.run([sys.executable, "-c", _ARENAS_PROBE], cwd=REPO, capture_output=True,
                         text=True, check=True, timeout=120, env=env)
    arenas, numpy_loaded = out.stdout.split()
    assert (int(arenas), numpy_loaded) == (1, "False")
