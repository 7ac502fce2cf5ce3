"""A CRC-framed write-ahead log with group commit.

Layout: ``wal/<writer>/<seq>.wal``, one directory per collector process, held with an
exclusive ``flock`` while the process lives. A frame is::

    u32 length | u32 crc32(body) | body = u8 signal | u64 received_ns | payload (OTLP bytes)

:meth:`Wal.append` writes a frame (no fsync); :meth:`Wal.sync` makes every frame up to a
sequence number durable with one ``fdatasync`` shared by all threads waiting at that moment
(group commit). :meth:`Wal.rotate` seals the current file so the rows buffered so far can be
published and the sealed files deleted afterwards.

Failures (the rules, and why):

- The WAL only ever writes to a descriptor it opened and still owns. A new file is opened
  *before* the old one is closed; when no file can be opened (EMFILE, ENOSPC, EIO) the WAL
  holds no descriptor and refuses appends (the receivers answer UNAVAILABLE) until one can be
  opened. A closed number may already belong to a client's socket.
- A failed write may leave a torn frame: nothing is appended to that file again.
- A failed ``fdatasync`` is final for every frame of that file not yet durable: Linux reports
  the error once and marks the lost pages clean, so a second fsync "succeeds" without the
  data. Those requests fail (never OK), the file is sealed and a new one started. Every
  ``fdatasync`` and every switch of files runs under one lock, so no fsync can consume
  another's error.
- Readers skip a bad frame by its length and CRC and keep the good frames after it; replay
  moves a file with unreadable bytes to ``wal/.quarantine/`` instead of deleting it (both in
  :mod:`fleetlens.collector.wal_files`).
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import threading
import zlib
from pathlib import Path

from fleetlens.collector.durable import make_dirs_durable
from fleetlens.collector.faults import Faults
from fleetlens.collector.telemetry import log
from fleetlens.collector.wal_files import (  # noqa: F401 - the WAL's public names, one import
    BODY_HEAD,
    FRAME_HEADER,
    HIDDEN_PREFIX,
    LOCK_NAME,
    QUARANTINE,
    SUFFIX,
    ReadResult,
    Record,
    orphan_dirs,
    quarantine,
    read_segment,
    remove_dir,
    segments,
)
from fleetlens.pipeline.storage import fsync_dir

#: Test hook: while the file named by this variable exists, WAL writes fail with ENOSPC.
FAULT_DISK_FULL_ENV = "FLEETLENS_FAULT_DISKFULL"


class Wal:
    """The write-ahead log of one collector process (thread-safe).

    Lock order: ``_sync_lock`` (every fdatasync, every switch of files) before
    ``_write_lock`` (the descriptor and the counters).
    """

    def __init__(self, root: Path, writer_id: str, faults: Faults | None = None) -> None:
        make_dirs_durable(root)
        # Create hidden, lock, then rename: no other process can mistake it for an orphan.
        hidden = root / f"{HIDDEN_PREFIX}{writer_id}-{secrets.token_hex(4)}"
        hidden.mkdir()
        self._lock_fd = os.open(hidden / LOCK_NAME, os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self.dir = root / writer_id
        os.rename(hidden, self.dir)
        fsync_dir(root)  # the directory and its rename must survive power loss
        self._faults = faults or Faults.from_env()
        self._disk_full = os.environ.get(FAULT_DISK_FULL_ENV)
        self._write_lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self._seq = 0  # frames written
        self._synced = 0  # every frame up to here is durable or in a broken range
        #: (after, upto] sequence ranges whose fsync failed: never acknowledged.
        self._broken: list[tuple[int, int]] = []
        self._segment = 0
        self._in_segment = 0  # frames in the current file
        self._writable = True  # False after a failed write: the file may end in a torn frame
        self._sealed: list[Path] = []
        self.bytes_written = 0
        self.fsyncs = 0
        self._fd: int | None = None
        self._fd, self._path = self._open_segment()

    def _open_segment(self) -> tuple[int, Path]:
        path = self.dir / f"{self._segment:012d}{SUFFIX}"
        self._faults.check("wal.open")
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600)
        try:
            fsync_dir(self.dir)  # the new file's directory entry must survive power loss too
        except OSError:
            os.close(fd)  # never keep a descriptor the WAL does not record
            raise
        self._segment += 1
        return fd, path

    def _check_disk_full(self) -> None:
        if self._disk_full and os.path.exists(self._disk_full):
            raise OSError(errno.ENOSPC, "No space left on device (injected)")

    def append(self, signal: int, received_ns: int, payload: bytes) -> int:
        """Write one frame (not yet durable); returns its sequence number for :meth:`sync`.

        Raises:
            OSError: the write failed, or no WAL file can be opened (the WAL is unavailable
                until one can). A partly written frame is skipped by readers, and nothing
                is appended after it: the next append starts a new file.
        """
        body = BODY_HEAD.pack(signal, received_ns) + payload
        frame = FRAME_HEADER.pack(len(body), zlib.crc32(body)) + body
        for _ in range(2):
            with self._write_lock:
                if self._fd is not None and self._writable:
                    return self._write(frame)
            self._recover()
        raise OSError(errno.EIO, "write-ahead log unavailable: no writable file")

    def _write(self, frame: bytes) -> int:
        assert self._fd is not None
        try:
            self._faults.check("wal.write")
            self._check_disk_full()
            written = os.write(self._fd, frame)
            if written != len(frame):
                raise OSError(errno.ENOSPC, f"short WAL write ({written} of {len(frame)} bytes)")
        except OSError:
            self._writable = False  # never append after a possibly torn frame
            raise
        self.bytes_written += len(frame)
        self._seq += 1
        self._in_segment += 1
        return self._seq

    def _recover(self) -> None:
        """Open a file to append to, sealing a torn one (both locks, in order)."""
        with self._sync_lock, self._write_lock:
            if self._fd is None:
                self._fd, self._path = self._open_segment()  # raises: still unavailable
                self._writable, self._in_segment = True, 0
            elif not self._writable:
                self._switch()

    def _switch(self, *, fsync_failed: bool = False) -> None:
        """Seal the current file and make a new one current (caller holds both locks).

        The new file is opened first. If that fails, a still writable file stays current
        and the error propagates; a torn or broken one is sealed anyway, leaving the WAL
        without a file (unavailable) rather than with a number it no longer owns.
        """
        old_fd, old_path = self._fd, self._path
        try:
            new: tuple[int, Path] | None = self._open_segment()
            error = None
        except OSError as exc:
            if self._writable and not fsync_failed:
                raise
            new, error = None, exc
        if old_fd is not None:
            try:
                if fsync_failed:  # a second fsync would "succeed" without the lost pages
                    raise OSError(errno.EIO, "an earlier fsync of this file failed")
                os.fdatasync(old_fd)
                self.fsyncs += 1
            except OSError:
                self._broken.append((self._synced, self._seq))
            finally:
                os.close(old_fd)
            self._synced = self._seq  # every frame of the old file is durable or broken
            self._sealed.append(old_path)
        self._fd, self._path = new if new else (None, old_path)
        self._writable, self._in_segment = True, 0
        if error is not None:
            log.error("write-ahead log unavailable until a new file opens: %s", error)
            raise error

    def sync(self, seq: int) -> None:
        """Return once frame ``seq`` is on disk; one fsync covers every waiting thread.

        Raises:
            OSError: the frame is not durable (its fsync failed: it never will be).
        """
        if self._synced < seq:
            with self._sync_lock:
                if self._synced < seq:  # else another thread's fsync covered us meanwhile
                    self._sync_current()
        for after, upto in reversed(self._broken):
            if after < seq <= upto:
                raise OSError(errno.EIO, "WAL fsync failed before this request was durable")

    def _sync_current(self) -> None:
        """fdatasync the current file (caller holds the sync lock, so no switch can close it).

        Frames not in the current file are durable or broken already: every switch
        fsyncs the file it seals or marks its frames broken.
        """
        with self._write_lock:
            target, fd = self._seq, self._fd
        assert fd is not None  # a frame past _synced lives in the current file
        try:
            self._faults.check("wal.fsync")
            self._check_disk_full()
            os.fdatasync(fd)
        except OSError as exc:
            log.error("WAL fsync failed; failing every request not yet durable: %s", exc)
            with self._write_lock:
                try:
                    self._switch(fsync_failed=True)
                except OSError:
                    pass  # unavailable until a file opens; this request fails either way
            return
        self.fsyncs += 1
        self._synced = max(self._synced, target)

    def rotate(self) -> list[Path]:
        """Seal the current file; return every sealed file not yet deleted.

        Call it while the caller's buffer is swapped, so the returned files hold exactly
        the frames whose rows are about to be published.

        Raises:
            OSError: no new file could be opened; the current one stays in use.
        """
        with self._sync_lock, self._write_lock:
            if self._fd is not None and self._in_segment:
                self._switch()
            sealed, self._sealed = self._sealed, []
            return sealed

    def close(self, *, remove: bool = False) -> None:
        """Close the current file and release the lock; ``remove`` deletes the directory
        (only when every frame's rows are published)."""
        with self._sync_lock, self._write_lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            if remove:
                remove_dir(self.dir, self._lock_fd)
            else:
                os.close(self._lock_fd)
