"""Fault injection for the WAL and the sink, in process: EMFILE, ENOSPC and EIO on open,
write and fsync (``faulty_os.FaultyOS`` in place of the WAL's ``os``), publish failures.

Every test checks the two promises: every request answered OK is stored (after a publish,
or after a crash and a replay), and no WAL byte went to a descriptor that is not a WAL file.
The real collector under the same faults: ``test_faults_e2e.py``.
"""

from __future__ import annotations

import contextlib
import errno
import random
import threading
import time

import pytest

from fleetlens.collector import wal as wal_module
from fleetlens.collector.config import CollectorConfig
from fleetlens.collector.errors import StorageFailure
from fleetlens.collector.faults import Faults
from fleetlens.collector.ingest import Ingest
from fleetlens.collector.signals import SPANS
from fleetlens.collector.sink import Segments, Sink
from fleetlens.collector.telemetry import Telemetry
from fleetlens.collector.testing import vllm_trace_request
from fleetlens.collector.wal import Wal
from fleetlens.collector.worker import replay_orphans
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.storage import DataDir, scan
from tests.collector.faulty_os import FaultyOS

SPANS_PER_REQUEST = 5


@pytest.fixture
def faulty(data_dir: DataDir, monkeypatch):
    fos = FaultyOS(data_dir.wal)
    monkeypatch.setattr(wal_module, "os", fos)
    yield fos
    fos.close_squatters()


def _make(data_dir: DataDir, writer: str = "w1") -> tuple[Ingest, Sink]:
    config = CollectorConfig()
    telemetry = Telemetry()
    ingest = Ingest(config, None, telemetry)
    sink = Sink(Segments(data_dir, writer), Wal(data_dir.wal, writer), telemetry,
                flush_rows=config.flush_rows, flush_interval_s=config.flush_interval_s,
                max_buffered_bytes=config.max_buffered_bytes)
    ingest.sink = sink
    return ingest, sink


def _keys(request) -> set[tuple[str, str]]:
    return {(s.trace_id.hex(), s.span_id.hex())
            for s in request.resource_spans[0].scope_spans[0].spans}


def _export(ingest: Ingest, seed: int, acked: set) -> bool:
    """Send one request; add its spans to ``acked`` when it is answered OK."""
    request = vllm_trace_request(SPANS_PER_REQUEST, seed=seed)
    try:
        ingest.export(SPANS, request.SerializeToString())
    except StorageFailure:
        return False
    acked.update(_keys(request))
    return True


def _stored(data_dir: DataDir) -> set[tuple[str, str]]:
    return set(scan(data_dir, "spans").select(c.TRACE_ID, c.SPAN_ID).collect().iter_rows())


def _crash_and_replay(data_dir: DataDir, sink: Sink) -> None:
    """The process dies without publishing; the next one replays its WAL."""
    sink.wal.close()
    ingest, survivor = _make(data_dir, writer="next")
    replay_orphans(data_dir, ingest, survivor.segments, ingest.telemetry)
    survivor.close()


def test_emfile_at_rotation_never_writes_into_a_reused_descriptor(data_dir, faulty) -> None:
    ingest, sink = _make(data_dir)
    acked: set = set()
    assert _export(ingest, 1, acked)
    faulty.fail("open", errno.EMFILE)  # no descriptor for the next file
    with pytest.raises(OSError):
        sink.flush()  # the new file is opened first: the current one stays in use
    answers = [_export(ingest, seed, acked) for seed in range(2, 6)]
    assert faulty.foreign == [] and faulty.squatted_bytes() == b""
    assert answers == [True] * 4  # and the WAL goes on in the file it has
    faulty.clear()
    assert sink.flush()
    sink.close()
    assert acked <= _stored(data_dir) and len(acked) == 5 * SPANS_PER_REQUEST


def test_enospc_then_emfile_refuses_until_a_file_opens(data_dir, faulty) -> None:
    ingest, sink = _make(data_dir)
    acked: set = set()
    assert _export(ingest, 1, acked)
    faulty.fail("write", errno.ENOSPC)
    faulty.fail("open", errno.EMFILE)
    assert not _export(ingest, 2, acked)  # the write fails: the file may hold a torn frame
    assert not _export(ingest, 3, acked)  # no new file: unavailable, and the old one is shut
    faulty.clear("write")
    assert not _export(ingest, 4, acked)  # still no file to write to
    assert faulty.foreign == [] and faulty.squatted_bytes() == b""
    faulty.clear()
    assert _export(ingest, 5, acked) and _export(ingest, 6, acked)
    assert faulty.foreign == [] and faulty.squatted_bytes() == b""
    _crash_and_replay(data_dir, sink)
    assert acked <= _stored(data_dir) and len(acked) == 3 * SPANS_PER_REQUEST


def test_a_failed_fsync_fails_every_request_waiting_for_it(data_dir, faulty) -> None:
    ingest, sink = _make(data_dir)
    acked: set = set()
    assert _export(ingest, 1, acked)
    faulty.fail("fsync", errno.EIO, once=True)
    faulty.fsync_gate = gate = threading.Event()
    answers: dict[int, bool] = {}

    def send(seed: int) -> None:
        answers[seed] = _export(ingest, seed, acked)

    leader = threading.Thread(target=send, args=(2,))
    leader.start()
    assert faulty.fsync_entered.wait(10)
    writes = faulty.writes
    followers = [threading.Thread(target=send, args=(seed,)) for seed in range(3, 7)]
    for thread in followers:
        thread.start()
    deadline = time.monotonic() + 10
    while faulty.writes < writes + len(followers) and time.monotonic() < deadline:
        time.sleep(0.01)  # every follower's frame is written behind the failing fsync
    gate.set()
    for thread in [leader, *followers]:
        thread.join(10)
    # The kernel reported the error to the leader only; the followers' fsyncs "succeed"
    # without their data, so none of them may be answered OK.
    assert answers == {seed: False for seed in range(2, 7)}
    assert _export(ingest, 7, acked)  # a new file: the retry is durable
    _crash_and_replay(data_dir, sink)
    assert acked <= _stored(data_dir) and len(acked) == 2 * SPANS_PER_REQUEST


def test_requests_after_a_failed_fsync_survive_a_replay(data_dir, faulty) -> None:
    ingest, sink = _make(data_dir)
    acked: set = set()
    assert _export(ingest, 1, acked)
    faulty.fail("fsync", errno.EIO, once=True)
    assert not _export(ingest, 2, acked)  # its pages are lost (zeros after a restart)
    assert _export(ingest, 3, acked) and _export(ingest, 4, acked)
    _crash_and_replay(data_dir, sink)
    stored = _stored(data_dir)
    assert acked <= stored and len(acked) == 3 * SPANS_PER_REQUEST
    # the file with the lost pages is kept for inspection, not deleted
    kept = list((data_dir.wal / wal_module.QUARANTINE).iterdir())
    assert [p.name.endswith(".wal.bad") for p in kept] == [True]


FAULTS = [("open", errno.EMFILE), ("open", errno.ENOSPC), ("write", errno.ENOSPC),
          ("write", errno.EIO), ("fsync", errno.EIO), ("fsync", errno.ENOSPC)]


@pytest.mark.parametrize("seed", range(6))
def test_random_faults_lose_nothing_acknowledged(data_dir, faulty, monkeypatch, seed) -> None:
    """Three clients send while faults come and go, publishes fail now and then, and the
    sink flushes; then the process either stops cleanly or crashes and is replayed."""
    rng = random.Random(seed)
    ingest, sink = _make(data_dir)
    acked: set = set()
    lock, stop = threading.Lock(), threading.Event()
    real_publish = Segments.publish
    publish_fails = threading.Event()

    def publish(self, signal, tables):
        if publish_fails.is_set():
            raise OSError(errno.ENOSPC, "No space left on device (injected publish)")
        return real_publish(self, signal, tables)

    monkeypatch.setattr(Segments, "publish", publish)

    def client(index: int) -> None:
        sent, mine = 0, set()
        while not stop.is_set():
            _export(ingest, seed * 10**6 + index * 10**4 + sent, mine)
            sent += 1
        with lock:
            acked.update(mine)

    clients = [threading.Thread(target=client, args=(i,)) for i in range(3)]
    for thread in clients:
        thread.start()
    for _ in range(25):
        point, code = rng.choice(FAULTS)
        faulty.fail(point, code, once=point == "fsync")
        publish_fails.set() if rng.random() < 0.3 else publish_fails.clear()
        time.sleep(rng.uniform(0.0, 0.03))
        with contextlib.suppress(OSError):
            sink.flush()
        faulty.clear()
        time.sleep(rng.uniform(0.0, 0.03))
    stop.set()
    for thread in clients:
        thread.join(30)
    publish_fails.clear()
    assert faulty.foreign == [] and faulty.squatted_bytes() == b""
    if seed % 2:
        _crash_and_replay(data_dir, sink)
    else:
        sink.close()
    assert len(acked) > 0
    assert acked - _stored(data_dir) == set()


def test_the_faults_file_starts_and_stops_faults(tmp_path) -> None:
    rules = tmp_path / "faults"
    faults = Faults(str(rules))
    faults.check("wal.write")  # no file: no fault
    rules.write_text("wal.write ENOSPC\npublish EIO\n")
    with pytest.raises(OSError) as raised:
        faults.check("wal.write")
    assert raised.value.errno == errno.ENOSPC
    faults.check("wal.fsync")  # not named
    rules.unlink()
    faults.check("wal.write")
    rules.write_text("wal.open ENOTANERRNO\n")
    with pytest.raises(ValueError, match="unknown fault 'ENOTANERRNO' for wal.open"):
        faults.check("wal.open")
