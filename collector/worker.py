"""One collector process: replay orphaned WALs, then serve OTLP until SIGTERM, then drain.

Several workers may share the ports (SO_REUSEPORT) and the data directory: each has its own
writer id and WAL directory, and at start-up replays the WAL directories of dead processes
(any it can lock), publishing their rows before it serves.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import secrets
import signal
import socket
import sys
import threading
import time
from collections import defaultdict
from typing import Any

from fleetlens.collector.balance import Balancer, PeerServer, descriptors
from fleetlens.collector.balance_board import PeerSetup
from fleetlens.collector.config import CollectorConfig
from fleetlens.collector.descriptors import http_connection_cap, open_files_limit
from fleetlens.collector.forward import ForwardSink
from fleetlens.collector.grpc_server import start_grpc
from fleetlens.collector.http_server import start_http
from fleetlens.collector.import_guard import keep_out
from fleetlens.collector.ingest import Ingest
from fleetlens.collector.process_memory import limit_malloc_arenas
from fleetlens.collector.self_metrics import SCRAPE_SLOTS, start_self_metrics
from fleetlens.collector.signals import BY_CODE
from fleetlens.collector.sink import Segments, Sink
from fleetlens.collector.telemetry import Telemetry, log
from fleetlens.collector.wal import Wal, orphan_dirs, read_segment, remove_dir, segments
from fleetlens.pipeline.schema.logsetup import configure_logging
from fleetlens.pipeline.storage import TMP_SUFFIX, DataDir, safe_component

#: Threads running gRPC Exports per worker: one decodes (the GIL) while the others await the
#: group-commit fsync. 32 connections closed loop on 2 workers (issue 34, AMD EPYC): the
#: same spans/s with 4 as with 8, 25-30 MiB less RSS (each running Export holds its bytes and
#: what its steps allocate, spread over more malloc heaps).
GRPC_THREADS = 4
#: Seconds gRPC waits for in-flight Exports at shutdown.
DRAIN_GRACE_S = 10.0
SUMMARY_EVERY_S = 60.0
#: Age after which a hidden temporary Parquet file is taken as left by a dead writer.
STALE_TMP_S = 600.0


def keep_out_pandas() -> None:
    """Make ``import pandas`` fail in this process (a collector worker).

    pyarrow probes for pandas the first time it converts a Python list (``pa.array``, so the
    first Export's ``Table.from_pydict``): importing pandas there took 160 ms, stalling the
    first requests after every start, and about 33 MiB of RSS per worker. The collector
    never hands pandas objects to Arrow, so pyarrow's "no pandas" answer changes nothing.
    """
    if "pandas" not in sys.modules:
        keep_out("pandas")


def new_writer_id() -> str:
    """A writer id unique across hosts, processes and restarts."""
    return safe_component(f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}")


def replay_orphans(data_dir: DataDir, ingest: Ingest, segs: Segments, telemetry: Telemetry) -> int:
    """Publish the rows of every WAL left by a dead process, then delete it; returns records."""
    replayed = 0
    for directory, lock_fd in orphan_dirs(data_dir.wal):
        tables: dict[int, list[Any]] = defaultdict(list)
        for path in segments(directory):
            result = read_segment(path)
            if result.torn_tail_bytes:
                telemetry.add("wal_torn_tails")
                log.warning("WAL %s: ignored a torn tail of %d bytes (a write cut short, never "
                            "acknowledged) after %d complete records",
                            path, result.torn_tail_bytes, len(result.records))
            if result.unreadable_bytes:
                log.error("WAL %s: %d unreadable bytes (kept in wal/.quarantine/); %d records "
                          "read", path, result.unreadable_bytes, len(result.records))
            for record in result.records:
                try:
                    sig, table = ingest.replay_table(record)
                except Exception as exc:  # a record we once accepted must decode; say so loudly
                    log.error("WAL %s: record could not be replayed: %s", path, exc)
                    continue
                tables[sig.code].append(table)
                replayed += 1
        for code, batch in tables.items():
            telemetry.add("flushed_rows", segs.publish(BY_CODE[code], batch))
        remove_dir(directory, lock_fd)
        log.info("replayed WAL %s", directory.name)
    telemetry.add("wal_replayed_records", replayed)
    return replayed


def remove_stale_tmp(data_dir: DataDir, older_than_s: float = STALE_TMP_S) -> int:
    """Delete hidden temporary Parquet files that a killed writer left under ``raw/``.

    Only old ones: a live collector sharing the data root may be writing a fresh one (and if
    it were removed anyway, that publish fails and is retried, losing nothing). On an object
    store there is nothing to find (a segment is one PUT of the whole object, no temporary
    file) and looking would LIST every object under ``raw/``: 0 without a request.
    """
    if data_dir.remote:
        return 0
    cutoff = time.time() - older_than_s
    removed = 0
    for path in (data_dir.root / "raw").rglob(f".*{TMP_SUFFIX}"):
        try:
            if path.stat().st_mtime < cutoff:
                path.unlink()
                removed += 1
        except FileNotFoundError:
            continue
    return removed


def _die_with_parent(parent_pid: int) -> None:
    """Linux: get SIGKILLed when the supervisor dies, so no orphan holds the ports."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        return
    if os.getppid() != parent_pid:
        os._exit(1)


def run_worker(config: CollectorConfig, root: str, slot: int = 0, array: Any = None,
               parent_pid: int | None = None, metrics_sock: socket.socket | None = None,
               peers: PeerSetup | None = None) -> None:
    """Run one collector process until SIGTERM or SIGINT, then drain and flush.

    ``metrics_sock``: the self-metrics listening socket the supervisor bound (None: off).
    ``peers``: the workers' shared board and sockets, to balance Exports (None: off).
    """
    keep_out_pandas()
    limit_malloc_arenas()  # the supervisor did already; kept for a direct call (benches)
    if parent_pid is not None:
        _die_with_parent(parent_pid)
        # a forked worker inherits the supervisor's handler: replace it, tag lines with the slot
        configure_logging(logging.INFO, process_tag=f"worker{slot}")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    data_dir = DataDir(root, config.wal_dir or None)
    telemetry = Telemetry(array, slot)
    writer_id = new_writer_id()
    segs = Segments(data_dir, writer_id)
    ingest = Ingest(config, None, telemetry)
    wal = Wal(data_dir.wal, writer_id)
    sink: Sink | ForwardSink
    if config.forward.enabled:  # edge mode: no Parquet here, dead WALs are forwarded too
        sink = ForwardSink(wal, telemetry, config.forward)
    else:
        replay_orphans(data_dir, ingest, segs, telemetry)
        if removed := remove_stale_tmp(data_dir):
            log.info("removed %d stale temporary Parquet files", removed)
        sink = Sink(segs, wal, telemetry, flush_rows=config.flush_rows,
                    flush_interval_s=config.flush_interval_s,
                    max_buffered_bytes=config.max_buffered_bytes)
    ingest.sink = sink  # type: ignore[assignment]  # both take accept() the same way
    sink.start()
    peer_server = None
    if peers is not None:  # after replay: peers hand over only to a worker that serves
        ingest.balancer = Balancer(peers, slot)
        try:
            peer_server = PeerServer(peers, slot, ingest.export_for_peer,
                                     config.max_request_bytes)
            peer_server.start()
        except OSError as exc:  # this worker still hands over; it only takes nothing
            log.warning("cannot take Exports from the other workers: %s", exc)
    grpc_server = start_grpc(config, ingest, threads=GRPC_THREADS)
    limit = open_files_limit()  # raised to the hard limit by the supervisor already
    kept = (SCRAPE_SLOTS if metrics_sock else 0) + descriptors(
        peers, GRPC_THREADS + config.http_threads)
    http_server = start_http(config, ingest, fd_cap=http_connection_cap(
        config.http_max_connections * 9 // 8, limit, kept))
    if metrics_sock is not None:
        start_self_metrics(metrics_sock, telemetry, parent_pid or os.getpid())
    gc.freeze()  # start-up objects never become garbage: keep them out of every GC scan
    log.info("collector %s serving OTLP/gRPC on %s and OTLP/HTTP on %s%s, data in %s%s",
             writer_id, config.grpc_address, config.http_address,
             " with TLS" if config.tls.enabled else "", data_dir.root,
             f", forwarding to {config.forward.address}" if config.forward.enabled else "")
    # Short waits: a signal delivered to one of gRPC's threads only runs its Python
    # handler when the main thread next wakes up.
    last_summary = time.monotonic()
    while not stop.wait(0.2):
        if time.monotonic() - last_summary >= SUMMARY_EVERY_S:
            last_summary = time.monotonic()
            log.info("collector %s: %s", writer_id, telemetry.summary())
    log.info("collector %s draining", writer_id)
    if peer_server is not None:
        peer_server.stop_taking()
    grpc_server.health.enter_graceful_shutdown()
    http_server.shutdown()  # stop accepting connections
    stopped = grpc_server.stop(DRAIN_GRACE_S)
    if not ingest.drain(DRAIN_GRACE_S):
        log.warning("collector %s: Exports still running after %.0f s", writer_id, DRAIN_GRACE_S)
    stopped.wait()
    sink.close()
    log.info("collector %s stopped: %s", writer_id, telemetry.summary())
