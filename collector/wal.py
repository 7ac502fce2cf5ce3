"""A CRC-framed write-ahead log with group commit.

Layout: ``wal/<writer>/<seq>.wal``, one directory per collector process, held with an
exclusive ``flock`` while the process lives. A frame is::

    u32 length | u32 crc32(body) | body = u8 signal | u64 received_ns | payload (OTLP bytes)

:meth:`Wal.append` writes a frame (no fsync); :meth:`Wal.sync` makes every frame up to a
sequence number durable with one ``fdatasync`` shared by all threads waiting at that moment
(group commit). :meth:`Wal.rotate` seals the current file so the rows buffered so far can be
published and the sealed files deleted afterwards. Readers stop at the first frame that is
short or fails its CRC (a torn tail after power loss or SIGKILL) and report it.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import struct
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from fleetlens.pipeline.storage import fsync_dir

_HEADER = struct.Struct("<II")
_BODY_HEAD = struct.Struct("<BQ")
SUFFIX = ".wal"
LOCK_NAME = "LOCK"
#: Test hook: while the file named by this variable exists, WAL writes fail with ENOSPC.
FAULT_DISK_FULL_ENV = "FLEETLENS_FAULT_DISKFULL"


@dataclass
class Record:
    """One logged request."""

    signal: int
    received_ns: int
    payload: bytes


@dataclass
class ReadResult:
    """The complete records of one WAL file and the size of its unreadable tail."""

    records: list[Record]
    torn_bytes: int


def read_segment(path: Path) -> ReadResult:
    """Read every complete, CRC-valid frame of ``path``; stop at the first bad one."""
    data = path.read_bytes()
    records, pos = [], 0
    while pos + _HEADER.size <= len(data):
        length, crc = _HEADER.unpack_from(data, pos)
        body = data[pos + _HEADER.size: pos + _HEADER.size + length]
        if length < _BODY_HEAD.size or len(body) != length or zlib.crc32(body) != crc:
            break
        signal, received_ns = _BODY_HEAD.unpack_from(body)
        records.append(Record(signal, received_ns, body[_BODY_HEAD.size:]))
        pos += _HEADER.size + length
    return ReadResult(records, len(data) - pos)


class Wal:
    """The write-ahead log of one collector process (thread-safe)."""

    def __init__(self, root: Path, writer_id: str) -> None:
        root.mkdir(parents=True, exist_ok=True)
        # Create hidden, lock, then rename: no other process can mistake it for an orphan.
        hidden = root / f".new-{writer_id}-{secrets.token_hex(4)}"
        hidden.mkdir()
        self._lock_fd = os.open(hidden / LOCK_NAME, os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self.dir = root / writer_id
        os.rename(hidden, self.dir)
        self._fault = os.environ.get(FAULT_DISK_FULL_ENV)
        self._write_lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self._seq = 0  # frames written
        self._synced = 0  # frames durable
        self._segment = 0
        self._in_segment = 0  # frames in the current file
        self._sealed: list[Path] = []
        self.bytes_written = 0
        self.fsyncs = 0
        self._fd = self._open_segment()

    def _open_segment(self) -> int:
        self._path = self.dir / f"{self._segment:012d}{SUFFIX}"
        fd = os.open(self._path, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600)
        fsync_dir(self.dir)  # the new file's directory entry must survive power loss too
        return fd

    def _check_fault(self) -> None:
        if self._fault and os.path.exists(self._fault):
            raise OSError(28, "No space left on device (injected)")

    def append(self, signal: int, received_ns: int, payload: bytes) -> int:
        """Write one frame (not yet durable); returns its sequence number for :meth:`sync`.

        Raises:
            OSError: the write failed (the frame may be partly written: a torn frame that
                readers skip; the file is sealed so later frames start clean).
        """
        body = _BODY_HEAD.pack(signal, received_ns) + payload
        frame = _HEADER.pack(len(body), zlib.crc32(body)) + body
        with self._write_lock:
            try:
                self._check_fault()
                written = os.write(self._fd, frame)
                if written != len(frame):
                    raise OSError(28, f"short WAL write ({written} of {len(frame)} bytes)")
            except OSError:
                self._roll()  # never append after a possibly torn frame
                raise
            self.bytes_written += len(frame)
            self._seq += 1
            self._in_segment += 1
            return self._seq

    def sync(self, seq: int) -> None:
        """Return once frame ``seq`` is on disk; one fsync covers every waiting thread."""
        if self._synced >= seq:
            return
        with self._sync_lock:
            if self._synced >= seq:
                return  # another thread's fsync covered us while we waited
            with self._write_lock:
                # A dup stays valid even if a failed append seals and closes the file.
                target, fd = self._seq, os.dup(self._fd)
            try:
                self._check_fault()
                os.fdatasync(fd)
            finally:
                os.close(fd)
            self.fsyncs += 1
            self._synced = max(self._synced, target)

    def _roll(self) -> None:
        """Seal the current file and start the next (caller holds the write lock)."""
        try:
            os.fdatasync(self._fd)
            self._synced = self._seq
        finally:
            os.close(self._fd)
            self._sealed.append(self._path)
            self._segment += 1
            self._in_segment = 0
            self._fd = self._open_segment()

    def rotate(self) -> list[Path]:
        """Seal the current file; return every sealed file not yet deleted.

        Call it while the caller's buffer is swapped, so the returned files hold exactly
        the frames whose rows are about to be published.
        """
        with self._sync_lock, self._write_lock:
            if self._in_segment:
                self._roll()
            sealed, self._sealed = self._sealed, []
            return sealed

    def close(self, *, remove: bool = False) -> None:
        """Close the current file and release the lock; ``remove`` deletes the directory
        (only when every frame's rows are published)."""
        with self._write_lock:
            os.close(self._fd)
            if remove:
                remove_dir(self.dir, self._lock_fd)
            else:
                os.close(self._lock_fd)


def orphan_dirs(root: Path) -> Iterator[tuple[Path, int]]:
    """WAL directories whose owner process is gone, each locked for the caller.

    Yields ``(directory, lock_fd)``; the caller replays the files and then removes the
    directory with :func:`remove_dir` (which releases the lock).
    """
    if not root.is_dir():
        return
    for entry in sorted(root.iterdir()):
        if not entry.is_dir() or entry.name.startswith("."):
            continue
        try:
            fd = os.open(entry / LOCK_NAME, os.O_CREAT | os.O_RDWR, 0o600)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)  # a live process owns it
            continue
        yield entry, fd


def segments(directory: Path) -> list[Path]:
    """The WAL files of one directory in write order."""
    return sorted(directory.glob(f"*{SUFFIX}"))


def remove_dir(directory: Path, lock_fd: int) -> None:
    """Delete a replayed WAL directory and release its lock."""
    for path in segments(directory):
        path.unlink(missing_ok=True)
    (directory / LOCK_NAME).unlink(missing_ok=True)
    os.close(lock_fd)
    directory.rmdir()
