"""WAL files on disk: the frame format, the reader, and what replay does with a directory.

A frame is::

    u32 length | u32 crc32(body) | body = u8 signal | u64 received_ns | payload (OTLP bytes)

:func:`read_segment` skips a bad frame by its length and CRC and keeps the good frames after
it. :func:`orphan_dirs` finds the directories of dead writers (also a hidden ``.new-*`` one
whose rename power loss undid); :func:`remove_dir` deletes one after replay, moving any file
with unreadable bytes to ``wal/.quarantine/`` instead of deleting it. The writer is
:mod:`fleetlens.collector.wal`.
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
    """The good records of one WAL file and how many of its bytes could not be read."""

    records: list[Record]
    torn_bytes: int


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


def read_segment(path: Path) -> ReadResult:
    """Read every CRC-valid frame of ``path``, skipping bad ones.

    A frame whose length fits in the file but whose CRC fails is skipped by its length (a
    flipped bit costs that frame only). A run of zero bytes is skipped to the next good frame.
    Anything else (a length that runs past the end: the torn tail of a write cut short by
    SIGKILL or power loss) ends the read. ``torn_bytes`` counts every byte not returned.
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
        resume = _after_zeros(data, pos) if length == 0 else None
        if resume is None:
            break
        bad += resume - pos
        pos = resume
    return ReadResult(records, bad + len(data) - pos)


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
    may still be recovered by hand.
    """
    for path in segments(directory):
        if read_segment(path).torn_bytes:
            quarantine(path)
        else:
            path.unlink(missing_ok=True)
    (directory / LOCK_NAME).unlink(missing_ok=True)
    os.close(lock_fd)
    directory.rmdir()
