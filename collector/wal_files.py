"""WAL files on disk: the frame format, the reader, and what replay does with a directory.

A frame is::

    u32 length | u32 crc32(body) | body = u8 signal | u64 received_ns | payload (OTLP bytes)

:func:`read_segment` skips a bad frame by its length and CRC and keeps the good frames after
it. It tells two kinds of loss apart: a *torn tail* (the last write cut short by SIGKILL or
power loss: never acknowledged, since an acknowledgement waits for the fsync of the whole
frame) and *unreadable bytes* (a CRC-failing frame, a corrupted length with good frames or a
whole body after it: possibly acknowledged). :func:`orphan_dirs` finds the directories of dead
writers (also a hidden ``.new-*`` one whose rename power loss undid); :func:`remove_dir`
deletes one after replay, moving any file with unreadable bytes to ``wal/.quarantine/``
instead of deleting it. The writer is :mod:`fleetlens.collector.wal`.
"""

from __future__ import annotations

import fcntl
import os
import re
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from fleetlens.collector.durable import make_dirs_durable
from fleetlens.collector.telemetry import log
from fleetlens.pipeline.storage import fsync_dir

FRAME_HEADER = struct.Struct("<II")
BODY_HEAD = struct.Struct("<BQ")
_NONZERO = re.compile(rb"[^\x00]")
SUFFIX = ".wal"
LOCK_NAME = "LOCK"
#: A WAL directory is created under this hidden prefix, locked, then renamed to its writer id.
HIDDEN_PREFIX = ".new-"
#: Where replay keeps WAL files with unreadable bytes (``<dir>-<file>.bad``), never deleted.
QUARANTINE = ".quarantine"
QUARANTINE_SUFFIX = ".bad"


@dataclass
class Record:
    """One logged request."""

    signal: int
    received_ns: int
    payload: bytes


@dataclass
class ReadResult:
    """The good records of one WAL file and the bytes that could not be read.

    ``unreadable_bytes`` may have held acknowledged records (keep the file for a human);
    ``torn_tail_bytes`` are the cut-short last write, which nobody was told is stored.
    """

    records: list[Record]
    unreadable_bytes: int = 0
    torn_tail_bytes: int = 0

    @property
    def lost_bytes(self) -> int:
        """Every byte of the file not returned as a record."""
        return self.unreadable_bytes + self.torn_tail_bytes


def _good_frame(data: bytes, pos: int) -> int | None:
    """End offset of the CRC-valid frame at ``pos``, or None."""
    if pos + FRAME_HEADER.size > len(data):
        return None
    length, crc = FRAME_HEADER.unpack_from(data, pos)
    end = pos + FRAME_HEADER.size + length
    if length < BODY_HEAD.size or end > len(data):
        return None
    return end if zlib.crc32(memoryview(data)[pos + FRAME_HEADER.size:end]) == crc else None


def _after_zeros(data: bytes, pos: int) -> int | None:
    """Start of the first good frame after the run of zero bytes at ``pos``, or None.

    Pages lost after a failed fsync read back as zeros. A frame may itself start with zero
    bytes (a length of 256 is ``00 01 00 00``), so the three offsets before the first
    non-zero byte are tried too.
    """
    found = _NONZERO.search(data, pos)
    if found is None:
        return None
    first = found.start()
    for start in range(max(pos + 1, first - 3), first + 1):
        if _good_frame(data, start) is not None:
            return start
    return None


def _next_good_frame(data: bytes, pos: int) -> int | None:
    """Start of the first CRC-valid frame after ``pos``, or None.

    Only offsets whose length field fits in the file are CRC-checked (found with numpy in
    one pass): a search over a torn tail of several MiB stays in milliseconds. Imported here,
    on a damaged file only: a worker imports pyarrow without numpy (collector/supervisor.py).
    """
    import numpy as np

    start = pos + 1
    count = len(data) - FRAME_HEADER.size - start + 1
    if count <= 0:
        return None
    raw = np.frombuffer(data, dtype=np.uint8)
    length = np.zeros(count, dtype=np.uint64)
    for shift in range(4):  # little-endian u32 at every offset
        length |= raw[start + shift:start + shift + count].astype(np.uint64) << (8 * shift)
    offsets = np.arange(start, start + count, dtype=np.uint64)
    fits = (length >= BODY_HEAD.size) & (offsets + FRAME_HEADER.size + length <= len(data))
    for candidate in np.flatnonzero(fits):
        if _good_frame(data, start + int(candidate)) is not None:
            return start + int(candidate)
    return None


def _cut_short(data: bytes, pos: int) -> bool:
    """Whether the frame at ``pos`` has the only shape a write cut short can leave: a sane
    length that runs past the end of the file, over bytes that are not a whole body under
    its CRC (that would be a frame whose length was corrupted after it was written)."""
    length, crc = FRAME_HEADER.unpack_from(data, pos)
    if length < BODY_HEAD.size or pos + FRAME_HEADER.size + length <= len(data):
        return False
    body = memoryview(data)[pos + FRAME_HEADER.size:]
    return not (len(body) >= BODY_HEAD.size and zlib.crc32(body) == crc)


def read_segment(path: Path) -> ReadResult:
    """Read every CRC-valid frame of ``path``, skipping bad ones.

    A frame whose length fits in the file but whose CRC fails is skipped by its length (a
    flipped bit costs that frame only). A run of zero bytes, or a length that runs past the
    end with a good frame after it (a corrupted length), is skipped to the next good frame;
    all of these count as ``unreadable_bytes``. What is left when no good frame follows is
    the torn tail of a write cut short (``torn_tail_bytes``) if it has that shape (fewer
    bytes than a header, or a header whose length runs past the end over an incomplete
    body); otherwise (zeros, a whole body under a corrupted length) it is unreadable too.
    """
    data = path.read_bytes()
    records: list[Record] = []
    pos = bad = 0
    while pos + FRAME_HEADER.size <= len(data):
        length, _crc = FRAME_HEADER.unpack_from(data, pos)
        end = pos + FRAME_HEADER.size + length
        if length >= BODY_HEAD.size and end <= len(data):
            if _good_frame(data, pos) is None:
                bad += end - pos
            else:
                body = data[pos + FRAME_HEADER.size:end]
                signal, received_ns = BODY_HEAD.unpack_from(body)
                records.append(Record(signal, received_ns, body[BODY_HEAD.size:]))
            pos = end
            continue
        resume = _after_zeros(data, pos) if length == 0 else _next_good_frame(data, pos)
        if resume is None:
            break
        bad += resume - pos
        pos = resume
    tail = len(data) - pos
    if tail >= FRAME_HEADER.size and not _cut_short(data, pos):
        return ReadResult(records, bad + tail, 0)  # zeros, a bad length: not a cut write
    return ReadResult(records, bad, tail)


def orphan_dirs(root: Path) -> Iterator[tuple[Path, int]]:
    """WAL directories whose owner process is gone, each locked for the caller.

    A hidden ``.new-*`` directory with WAL files is one whose rename power loss undid: it is
    replayed too. Yields ``(directory, lock_fd)``; the caller replays the files and then
    removes the directory with :func:`remove_dir` (which releases the lock).
    """
    if not root.is_dir():
        return
    for entry in sorted(root.iterdir()):
        if not entry.is_dir():
            continue
        if entry.name.startswith(".") and not (
                entry.name.startswith(HIDDEN_PREFIX) and segments(entry)):
            continue  # the quarantine, or a directory still being created
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


def quarantine(path: Path) -> Path:
    """Move a WAL file with unreadable bytes to ``wal/.quarantine/``; returns its new path."""
    folder = path.parent.parent / QUARANTINE
    make_dirs_durable(folder)
    target = folder / f"{path.parent.name.lstrip('.')}-{path.name}{QUARANTINE_SUFFIX}"
    os.rename(path, target)
    fsync_dir(folder)
    log.warning("WAL %s has unreadable bytes: kept as %s", path, target)
    return target


def remove_dir(directory: Path, lock_fd: int) -> None:
    """Delete a replayed WAL directory and release its lock.

    A file with unreadable bytes is quarantined, never deleted: what could not be read
    may still be recovered by hand. A torn tail alone is no reason to keep a file: it was
    never acknowledged, and a quarantine that grows with every crash would fill the edge's
    bound (``forward.max_pending_bytes``) and need a human after each one.
    """
    for path in segments(directory):
        if read_segment(path).unreadable_bytes:
            quarantine(path)
        else:
            path.unlink(missing_ok=True)
    (directory / LOCK_NAME).unlink(missing_ok=True)
    os.close(lock_fd)
    directory.rmdir()
