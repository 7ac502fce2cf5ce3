"""Edge mode (``fleetlens collector --forward HOST:PORT``): keep the WAL, forward it upstream.

An edge collector acknowledges an Export once it is in its own WAL (fsynced, as always) and,
instead of publishing Parquet, forwards the logged requests to a central collector over
OTLP/gRPC. :class:`ForwardSink` takes the place of :class:`~fleetlens.collector.sink.Sink`:

- ``accept`` appends and fsyncs, then returns (the client is acknowledged). Above
  ``forward.max_pending_bytes`` of WAL not yet forwarded (summed over all workers through the
  shared telemetry array) plus bytes in ``wal/.quarantine/`` it refuses with UNAVAILABLE +
  RetryInfo and says so in the log, once per episode: the disk stays bounded and nothing
  acknowledged is ever dropped. A request larger than the whole bound is refused for good
  (RESOURCE_EXHAUSTED without RetryInfo): waiting would never make room for it.
- A thread seals the current WAL file, sends its records in order (merged into batches of
  one signal) and deletes the file once the central collector acknowledged all of them.
  A cursor per file (:mod:`~fleetlens.collector.forward_files`) records progress after every
  acknowledgement, so a restart resends at most one batch: delivery is at-least-once, and
  the pipeline's dedup on (trace_id, span_id), (series, timestamp) and, for log records,
  their content (``pipeline.logsignal.dedup_log_records``) removes the repeat.
- WAL directories of dead processes (a crashed edge) are forwarded the same way, oldest
  first, then removed; while the central collector is down everything waits on disk.
- A request the central collector refuses for good is quarantined, unless it is the
  ``forward.max_refused_in_a_row``-th such refusal in a row: then the central collector is
  unhealthy and forwarding stops instead (:mod:`~fleetlens.collector.forward_health`).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from fleetlens.collector.config import ForwardConfig
from fleetlens.collector.errors import Overloaded, StorageFailure, TooLarge
from fleetlens.collector.forward_client import SETUP_CODES, ForwardClient, Verdict
from fleetlens.collector.forward_files import (
    Cursor,
    batches,
    dead_letter,
    remove_stale_cursors,
)
from fleetlens.collector.forward_health import QuarantineSize, RefusalStreak
from fleetlens.collector.signals import BY_CODE, Signal
from fleetlens.collector.telemetry import Telemetry, log
from fleetlens.collector.wal import (
    ReadResult,
    Wal,
    orphan_dirs,
    quarantine,
    read_segment,
    remove_dir,
    segments,
)

POLL_S = 0.2
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 5.0
#: Seconds a stopping edge keeps trying to forward what is left (the rest waits on disk).
CLOSE_GRACE_S = 5.0
#: The current WAL file is sealed at this size even while older files wait (a file is read
#: whole when it is forwarded).
SEAL_BYTES = 64 * 1024 * 1024


class ForwardSink:
    """Durable acceptance into the WAL, forwarding to the central collector in a thread."""

    def __init__(self, wal: Wal, telemetry: Telemetry, config: ForwardConfig,
                 client: ForwardClient | None = None) -> None:
        self.wal = wal
        self.telemetry = telemetry
        self.config = config
        self.client = client or ForwardClient(config)
        self._lock = threading.Lock()
        self._queue: list[Path] = []  # sealed or adopted WAL files, oldest first
        self._queued_bytes = 0
        self._sealed_at = 0  # wal.bytes_written when the current file was last sealed
        self._orphans: list[tuple[Path, int]] = []  # adopted directories and their locks
        self._full = False
        self._down_since: float | None = None
        self._down_code: Any = None
        self._stop = threading.Event()
        self._deadline: float | None = None  # set by close(): the end of its grace period
        self._streak = RefusalStreak(config.max_refused_in_a_row, config.address, telemetry)
        self._quarantine = QuarantineSize(wal.dir.parent)
        self._thread = threading.Thread(target=self._run, name="forwarder", daemon=True)

    # -- accepting ---------------------------------------------------------------------

    @property
    def pending_bytes(self) -> int:
        """This worker's WAL bytes not yet forwarded (queued files and the current one)."""
        return self._queued_bytes + self.wal.bytes_written - self._sealed_at

    def accept(self, signal: Signal, received_ns: int, payload: bytes, table: Any) -> None:
        """Make a request durable in the WAL; return once it is synced (then it is ours).

        Raises:
            Overloaded: the WAL holds ``max_pending_bytes`` not yet forwarded.
            StorageFailure: the WAL write or fsync failed (nothing may be acknowledged).
        """
        if not table.num_rows:
            return  # everything was rejected: nothing to forward
        self._check_room(len(payload))
        try:
            self.wal.sync(self.wal.append(signal.code, received_ns, payload))
        except OSError as exc:
            self.telemetry.add("storage_failures")
            log.error("write-ahead log failed: %s", exc)
            raise StorageFailure(f"write-ahead log unavailable: {exc.strerror or exc}") from None
        self.telemetry.add("wal_bytes", len(payload))
        self.telemetry.set("forward_pending_bytes", self.pending_bytes)

    def _check_room(self, size: int) -> None:
        limit = self.config.max_pending_bytes
        if size > limit:
            self.telemetry.add("oversize_requests")
            raise TooLarge(f"request of {size} bytes is larger than this edge collector's "
                           f"whole WAL bound (forward.max_pending_bytes = {limit})")
        self.telemetry.set("forward_pending_bytes", self.pending_bytes)
        quarantined = self._quarantine.bytes()
        pending = self.telemetry.total("forward_pending_bytes") + quarantined
        full = pending + size > limit
        with self._lock:
            changed, self._full = full != self._full, full
        if changed and full:
            log.error("edge WAL full: %d bytes not yet forwarded to %s or quarantined "
                      "(%d of them in wal/.quarantine, removed only by hand; limit "
                      "forward.max_pending_bytes = %d); refusing Exports (UNAVAILABLE, "
                      "retryable) until the central collector takes some",
                      pending, self.config.address, quarantined, limit)
        elif changed:
            log.info("edge WAL below its limit again (%d bytes pending); accepting Exports",
                     pending)
        if full:
            self.telemetry.add("refused_requests")
            raise Overloaded(f"edge collector WAL full ({pending} bytes not yet forwarded "
                             f"to {self.config.address}); retry later")

    # -- forwarding --------------------------------------------------------------------

    def start(self) -> None:
        """Start the forwarding thread (it adopts dead processes' WALs first)."""
        self._thread.start()

    def _adopt_orphans(self) -> None:
        """Queue the WAL files of dead processes (their directory locks are now ours)."""
        for directory, lock_fd in orphan_dirs(self.wal.dir.parent):
            files = segments(directory)
            self._orphans.append((directory, lock_fd))
            self._enqueue(files)
            log.info("forwarding the WAL %s left by a stopped process (%d files)",
                     directory.name, len(files))
        if removed := remove_stale_cursors(self.wal.dir.parent):
            log.info("removed %d forwarding cursors of deleted WAL files", removed)

    def _enqueue(self, files: list[Path]) -> None:
        for path in files:
            self._queue.append(path)
            self._queued_bytes += path.stat().st_size

    def _seal(self) -> None:
        """Seal the current WAL file (if it has frames) and queue it."""
        written = self.wal.bytes_written
        sealed = self.wal.rotate()
        self._sealed_at = written
        self._enqueue(sealed)

    def _run(self) -> None:
        adopted, delay = False, POLL_S
        while True:
            try:
                if not adopted:
                    self._adopt_orphans()
                    adopted = True
                done = self.forward_pending()
            except Exception:  # a disk error on a cursor, say: keep the thread, retry later
                log.exception("forwarding failed; will retry")
                done = False
            # Also while the central collector is down: the other workers' bound must see
            # a backlog this worker adopted before it accepts anything itself.
            self.telemetry.set("forward_pending_bytes", self.pending_bytes)
            delay = POLL_S if done else min(RETRY_MAX_S, max(RETRY_FIRST_S, delay * 2))
            if self._stop.wait(delay):
                return

    def forward_pending(self) -> bool:
        """Seal the current file when due and forward every queued file, oldest first.

        Returns False when the central collector did not take everything queued (retry
        later); True otherwise, though new frames may have arrived in the current file.
        """
        if not self._queue or self.wal.bytes_written - self._sealed_at >= SEAL_BYTES:
            self._seal()
        while self._queue:
            path = self._queue[0]
            done, result = self._forward_file(path)
            if not done:
                return False
            self._queue.pop(0)
            self._queued_bytes -= path.stat().st_size
            if result.torn_tail_bytes:
                self.telemetry.add("wal_torn_tails")
                log.warning("WAL %s: forwarded %d records; a torn tail of %d bytes (a write cut "
                            "short, never acknowledged) dropped", path, len(result.records),
                            result.torn_tail_bytes)
            if result.unreadable_bytes:
                quarantine(path)  # its readable records went out; keep the rest for a human
            else:
                path.unlink()
            Cursor(path).close(remove=True)
        self._release_orphans()
        self.telemetry.set("forward_pending_bytes", self.pending_bytes)
        return True

    def _forward_file(self, path: Path) -> tuple[bool, ReadResult]:
        """Send the records of ``path`` the central collector has not acknowledged yet;
        returns whether all went out, and what was read."""
        result = read_segment(path)
        records = result.records
        cursor = Cursor(path)
        try:
            for first, end in batches(records, cursor.sent, self.config.max_batch_bytes):
                if not self._send(path, records, first, end, cursor):
                    return False, result
            return True, result
        finally:
            cursor.close()

    def _send(self, path: Path, records: list[Any], first: int, end: int,
              cursor: Cursor) -> bool:
        signal = BY_CODE[records[first].signal]
        payload = b"".join(r.payload for r in records[first:end])
        if self._deadline is None:  # the forwarding thread: cancelled when stopping
            answer = self.client.send(signal, payload, abort=self._stop)
        else:  # close(): what is left of the grace period bounds every call
            left = self._deadline - time.monotonic()
            if left <= 0:
                return False
            answer = self.client.send(signal, payload, timeout=min(left, self.config.timeout_s))
        if answer.verdict is Verdict.PERMANENT and end - first > 1:
            # The merged batch may be what is refused (too large): one request at a time.
            return all(self._send(path, records, i, i + 1, cursor) for i in range(first, end))
        if answer.verdict is Verdict.RETRY:
            if self._stop.is_set() and self._deadline is None:
                return False  # cancelled because the collector stops: close() takes over
            self.telemetry.add("forward_failures")
            self._went_down(answer.detail, answer.code)
            return False
        if answer.verdict is Verdict.PERMANENT:
            if not self._streak.refused(answer.detail):
                self.telemetry.add("forward_failures")
                return False  # the central side is unhealthy: keep the record, retry later
            dead_letter(path, first, records[first], answer.detail)
            self._quarantine.grew()
            self.telemetry.add("forward_dropped_requests")
        else:
            self._streak.accepted()
        if answer.verdict is Verdict.SENT and answer.rejected:
            log.warning("central collector rejected %d %s items of a forwarded request: %s",
                        answer.rejected, signal.folder, answer.detail)
        self._came_back()
        cursor.advance(end)
        self.telemetry.add("forwarded_requests", end - first)
        self.telemetry.add("forwarded_bytes", len(payload))
        return True

    def _went_down(self, detail: str, code: Any) -> None:
        """Log an outage once, and again whenever its cause (the status code) changes."""
        if self._down_since is None:
            self._down_since = time.monotonic()
        elif code == self._down_code:
            return
        self._down_code = code
        hint = " (check forward.auth_token / TLS settings)" if code in SETUP_CODES else ""
        log.error("cannot forward to %s: %s%s; %d bytes wait in the WAL, retrying",
                  self.config.address, detail, hint, self.pending_bytes)

    def _came_back(self) -> None:
        if self._down_since is not None:
            log.info("forwarding to %s again after %.1f s", self.config.address,
                     time.monotonic() - self._down_since)
            self._down_since = self._down_code = None

    def _release_orphans(self) -> None:
        """Remove adopted directories whose every file was forwarded."""
        for directory, lock_fd in self._orphans:
            remove_dir(directory, lock_fd)
        self._orphans = []

    def close(self) -> None:
        """Stop forwarding; try for ``CLOSE_GRACE_S`` to forward what is left, then close
        the WAL (deleting it only when everything was forwarded)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        deadline = self._deadline = time.monotonic() + CLOSE_GRACE_S
        done = False
        while not done and time.monotonic() < deadline:
            try:
                done = self.forward_pending() and self.pending_bytes == 0
            except Exception:
                log.exception("forwarding failed while stopping")
            if not done:
                time.sleep(RETRY_FIRST_S)
        if not done:
            log.warning("%d bytes not yet forwarded to %s; they wait in the WAL for the "
                        "next start", self.pending_bytes, self.config.address)
            for _, lock_fd in self._orphans:
                os.close(lock_fd)  # left for the next start to adopt
        self.wal.close(remove=done)
        self.client.close()
