"""The sink in process: WAL before buffer, publish then delete, retries, backpressure, replay.

Named crash points: a publish that fails half way keeps the WAL until a later publish
succeeds; a process that dies before publishing leaves a WAL that replay turns into rows.
"""

from __future__ import annotations

import os
import threading
import time

import pyarrow.parquet as pq
import pytest

from fleetlens.collector.config import CollectorConfig
from fleetlens.collector.errors import Overloaded, StorageFailure
from fleetlens.collector.ingest import Ingest
from fleetlens.collector.signals import SPANS
from fleetlens.collector.sink import Segments, Sink
from fleetlens.collector.telemetry import Telemetry
from fleetlens.collector.testing import vllm_trace_request
from fleetlens.collector.wal import FAULT_DISK_FULL_ENV, Wal
from fleetlens.collector.worker import replay_orphans
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.storage import DataDir, scan


def _make(data_dir: DataDir, writer: str = "w1", **kw) -> tuple[Ingest, Sink]:
    config = CollectorConfig(**kw)
    telemetry = Telemetry()
    ingest = Ingest(config, None, telemetry)
    sink = Sink(Segments(data_dir, writer), Wal(data_dir.wal, writer), telemetry,
                flush_rows=config.flush_rows, flush_interval_s=config.flush_interval_s,
                max_buffered_bytes=config.max_buffered_bytes)
    ingest.sink = sink
    return ingest, sink


def _wal_files(data_dir: DataDir) -> list:
    return sorted(data_dir.wal.rglob("*.wal"))


def _rows(data_dir: DataDir) -> int:
    return scan(data_dir, "spans").collect().height


def test_publish_then_delete_the_sealed_wal(data_dir) -> None:
    ingest, sink = _make(data_dir)
    for seed in range(3):
        ingest.export(SPANS, vllm_trace_request(40, seed=seed).SerializeToString())
    assert _rows(data_dir) == 0 and _wal_files(data_dir)
    assert sink.flush()
    assert _rows(data_dir) == 120
    assert [p.stat().st_size for p in _wal_files(data_dir)] == [0]  # only the fresh file
    sink.close()
    assert _wal_files(data_dir) == []


def test_a_failed_publish_keeps_the_wal_and_retries(data_dir, monkeypatch) -> None:
    ingest, sink = _make(data_dir)
    ingest.export(SPANS, vllm_trace_request(30, seed=1).SerializeToString())
    real = Segments.publish
    calls = {"n": 0}

    def flaky(self, signal, tables):
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError(28, "No space left on device")
        return real(self, signal, tables)

    monkeypatch.setattr(Segments, "publish", flaky)
    assert not sink.flush()
    assert _rows(data_dir) == 0
    assert any(p.stat().st_size for p in _wal_files(data_dir))  # still holds the frame
    assert sink.buffered_bytes > 0
    ingest.export(SPANS, vllm_trace_request(20, seed=2).SerializeToString())
    assert sink.flush()  # the failed batch first, then the new one
    assert _rows(data_dir) == 50 and sink.buffered_bytes == 0
    sink.close()
    assert _wal_files(data_dir) == []


def test_backpressure_and_wal_failure_refuse_without_buffering(data_dir, tmp_path,
                                                              monkeypatch) -> None:
    flag = tmp_path / "full"
    monkeypatch.setenv(FAULT_DISK_FULL_ENV, str(flag))
    ingest, sink = _make(data_dir, max_buffered_bytes=200_000)
    payload = vllm_trace_request(200, seed=3).SerializeToString()
    ingest.export(SPANS, payload)
    accepted = 1
    with pytest.raises(Overloaded):
        for _ in range(10):
            ingest.export(SPANS, payload)
            accepted += 1
    assert accepted < 10
    sink.flush()
    flag.touch()
    before = sink.buffered_bytes
    with pytest.raises(StorageFailure):
        ingest.export(SPANS, payload)
    assert sink.buffered_bytes == before
    flag.unlink()
    ingest.export(SPANS, payload)
    sink.close()
    assert _rows(data_dir) == 200 * (accepted + 1)


def test_a_process_that_died_before_publishing_is_replayed(data_dir) -> None:
    ingest, sink = _make(data_dir, writer="dead")
    for seed in range(4):
        ingest.export(SPANS, vllm_trace_request(25, seed=seed).SerializeToString())
    sink.wal.close()  # the process "dies": its lock goes, its WAL stays
    assert _rows(data_dir) == 0
    survivor, other = _make(data_dir, writer="alive")
    replayed = replay_orphans(data_dir, survivor, other.segments, survivor.telemetry)
    assert replayed == 4 and _rows(data_dir) == 100
    assert not (data_dir.wal / "dead").exists()
    other.close()


def test_rows_of_several_hours_go_to_one_segment_per_hour(data_dir) -> None:
    hour_ns = 3600 * 10**9
    base = (time.time_ns() // hour_ns - 2) * hour_ns  # two hours ago, on the hour
    ingest, sink = _make(data_dir)
    # three requests buffered together, their spans in two different hours
    ingest.export(SPANS, vllm_trace_request(
        30, seed=1, start_ns=base + hour_ns - 10**9).SerializeToString())
    ingest.export(SPANS, vllm_trace_request(20, seed=2, start_ns=base + 5 * 10**9)
                  .SerializeToString())
    ingest.export(SPANS, vllm_trace_request(10, seed=3, start_ns=base + hour_ns + 10**9)
                  .SerializeToString())
    assert sink.flush()
    sink.close()
    by_hour: dict[str, int] = {}
    for path in data_dir.raw("spans").rglob("*.parquet"):
        rows = pq.read_metadata(path).num_rows
        by_hour[path.parent.name] = by_hour.get(path.parent.name, 0) + rows
        starts = pq.read_table(path, columns=[c.START_NS])[c.START_NS].to_pylist()
        assert {s // hour_ns for s in starts} == {starts[0] // hour_ns}  # one hour per file
    first, second = (f"hour={(base + k * hour_ns) // hour_ns % 24:02d}" for k in (0, 1))
    assert by_hour == {first: 50, second: 10}
    assert _rows(data_dir) == 60


def test_segments_encode_columns_by_type(data_dir) -> None:
    ingest, sink = _make(data_dir)
    for seed in range(2):  # two segments: the options must survive being used twice
        ingest.export(SPANS, vllm_trace_request(50, seed=seed).SerializeToString())
        assert sink.flush()
    sink.close()
    files = sorted(data_dir.raw("spans").rglob("*.parquet"))
    assert len(files) == 2
    for path in files:
        group = pq.read_metadata(path).row_group(0)
        encodings = {group.column(i).path_in_schema: set(group.column(i).encodings)
                     for i in range(group.num_columns)}
        dictionary = {"PLAIN_DICTIONARY", "RLE_DICTIONARY"}
        assert not encodings[c.TRACE_ID] & dictionary  # distinct values: no dictionary
        assert encodings[c.SERVICE_NAME] & dictionary
        assert "BYTE_STREAM_SPLIT" in encodings[c.GEN_AI_E2E_S]
        assert "DELTA_BINARY_PACKED" in encodings[c.START_NS]
    assert _rows(data_dir) == 100


def _record_dir_fsyncs(monkeypatch) -> list[tuple[str, list[str]]]:
    """Every directory fsynced from now on, with what it held at that moment."""
    seen: list[tuple[str, list[str]]] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if os.path.isdir(path):
            seen.append((path, sorted(os.listdir(path))))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return seen


def test_new_date_and_hour_folders_are_fsynced_into_their_parents(data_dir, monkeypatch) -> None:
    ingest, sink = _make(data_dir)
    ingest.export(SPANS, vllm_trace_request(10, seed=1).SerializeToString())
    seen = _record_dir_fsyncs(monkeypatch)
    assert sink.flush()
    (path,) = data_dir.raw("spans").rglob("*.parquet")
    hour, date = path.parent, path.parent.parent
    # the entry of each new folder is made durable in its parent, or power loss can take
    # the published file away after its WAL is deleted
    assert (str(date), [hour.name]) in seen
    assert (str(date.parent), [date.name]) in seen
    sink.close()


def test_a_wal_dir_whose_rename_power_loss_undid_is_replayed(data_dir) -> None:
    ingest, sink = _make(data_dir, writer="dead")
    for seed in range(3):
        ingest.export(SPANS, vllm_trace_request(10, seed=seed).SerializeToString())
    sink.wal.close()
    (data_dir.wal / "dead").rename(data_dir.wal / ".new-dead-0a1b2c3d")
    survivor, other = _make(data_dir, writer="alive")
    assert replay_orphans(data_dir, survivor, other.segments, survivor.telemetry) == 3
    assert _rows(data_dir) == 30 and not (data_dir.wal / ".new-dead-0a1b2c3d").exists()
    other.close()


def test_failed_publishes_are_retried_with_backoff(data_dir, monkeypatch) -> None:
    failing, attempts = threading.Event(), []
    failing.set()
    real = Segments.publish

    def flaky(self, signal, tables):
        attempts.append(time.monotonic())
        if failing.is_set():
            raise OSError(28, "No space left on device")
        return real(self, signal, tables)

    monkeypatch.setattr(Segments, "publish", flaky)
    ingest, sink = _make(data_dir, flush_interval_s=0.05)
    ingest.export(SPANS, vllm_trace_request(10, seed=1).SerializeToString())
    sink.start()
    time.sleep(2.0)
    tried = len(attempts)
    failing.clear()
    deadline = time.monotonic() + 20
    while sink.buffered_bytes and time.monotonic() < deadline:
        time.sleep(0.05)
    sink.close()
    assert _rows(data_dir) == 10
    # Retrying every 50 ms would be about 40 tries in those 2 s. The waits double from
    # 0.1 s (0.1 + 0.2 + 0.4 + 0.8 = 1.5 s), so at most 5 fit; a slow machine makes fewer.
    assert 1 <= tried <= 6
