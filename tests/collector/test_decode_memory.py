"""What one worker holds per Export in flight (issue 34: RSS at 32 connections).

A parsed request costs about three times its bytes; the decode steps hold the GIL, so more of
them at once only interleave while each holds its request. Exports decode
``DECODING_AT_ONCE`` at a time, and none keeps its parsed request while the WAL fsync is
awaited (the wait every gRPC and HTTP thread spends most of an Export in).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from fleetlens.collector import ingest as ingest_module
from fleetlens.collector.config import CollectorConfig
from fleetlens.collector.ingest import Ingest
from fleetlens.collector.signals import SPANS
from fleetlens.collector.sink import Segments, Sink
from fleetlens.collector.telemetry import Telemetry
from fleetlens.collector.testing import vllm_trace_request
from fleetlens.collector.wal import Wal
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.storage import DataDir, scan


def _ingest(data_dir: DataDir) -> tuple[Ingest, Sink]:
    config, telemetry = CollectorConfig(), Telemetry()
    sink = Sink(Segments(data_dir, "w1"), Wal(data_dir.wal, "w1"), telemetry,
                flush_rows=config.flush_rows, flush_interval_s=60.0,
                max_buffered_bytes=config.max_buffered_bytes)
    return Ingest(config, sink, telemetry), sink


def test_exports_decode_a_bounded_number_at_once(data_dir, monkeypatch) -> None:
    ingest, sink = _ingest(data_dir)
    payloads = [vllm_trace_request(16, seed=i).SerializeToString() for i in range(8)]
    decoding, peak, lock = [0], [0], threading.Lock()
    real_decode = ingest.decode

    def slow_decode(*args: Any, **kwargs: Any) -> Any:
        with lock:
            decoding[0] += 1
            peak[0] = max(peak[0], decoding[0])
        try:
            time.sleep(0.05)  # long enough for every thread to arrive meanwhile
            return real_decode(*args, **kwargs)
        finally:
            with lock:
                decoding[0] -= 1

    monkeypatch.setattr(ingest, "decode", slow_decode)
    errors: list[BaseException] = []

    def export(payload: bytes) -> None:
        try:
            ingest.export(SPANS, payload)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=export, args=(p,)) for p in payloads]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    sink.close()
    assert not errors
    assert 1 <= peak[0] <= getattr(ingest_module, "DECODING_AT_ONCE", 2)
    assert scan(data_dir, "spans").select(c.TRACE_ID).collect().height == 8 * 16


def test_the_parsed_request_is_not_held_during_the_wal_fsync(data_dir, monkeypatch) -> None:
    ingest, sink = _ingest(data_dir)
    parsed: list[Any] = []
    real_parse, real_sync = ingest.parse, sink.wal.sync
    counts: list[int] = []

    def parse(signal: Any, payload: bytes) -> Any:
        parsed.append(real_parse(signal, payload))
        return parsed[-1]

    def sync(seq: int) -> None:
        # references: the list here and getrefcount's argument; a third is a frame's
        counts.append(sys.getrefcount(parsed[-1]))
        real_sync(seq)

    monkeypatch.setattr(ingest, "parse", parse)
    monkeypatch.setattr(sink.wal, "sync", sync)
    ingest.export(SPANS, vllm_trace_request(32, seed=1).SerializeToString())
    sink.close()
    assert counts == [2]
