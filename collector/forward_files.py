"""What an edge collector keeps on disk besides its WAL: how far each WAL file was forwarded,
and the records the central collector refused for good.

Progress lives in ``wal/.forward/<dir>-<file>.sent``, outside the WAL directories (those stay
exactly what replay expects, so a collector started later without ``--forward`` can still
publish them itself). A cursor is 8 bytes, the number of records of that file the central
collector acknowledged, rewritten in place and fdatasynced after every acknowledgement: after
a crash the edge resends at most the one batch whose answer it did not record (the pipeline
deduplicates spans and points on their keys, log records on their content).
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

from fleetlens.collector.durable import make_dirs_durable
from fleetlens.collector.telemetry import log
from fleetlens.collector.wal_files import (
    BODY_HEAD,
    FRAME_HEADER,
    QUARANTINE,
    QUARANTINE_SUFFIX,
    Record,
)
from fleetlens.pipeline.storage import fsync_dir

#: Folder (under the WAL root) of the forwarding cursors; hidden, so replay skips it.
PROGRESS = ".forward"
CURSOR_SUFFIX = ".sent"
_COUNT = struct.Struct("<Q")


def cursor_path(wal_file: Path) -> Path:
    """Where the cursor of ``wal_file`` (``wal/<dir>/<seq>.wal``) lives."""
    return wal_file.parent.parent / PROGRESS / f"{wal_file.parent.name}-{wal_file.name}" \
        f"{CURSOR_SUFFIX}"


class Cursor:
    """Records of one WAL file already acknowledged by the central collector."""

    def __init__(self, wal_file: Path) -> None:
        self.path = cursor_path(wal_file)
        self._fd: int | None = None
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            data = b""
        # A cursor shorter than 8 bytes was never completely written: start from 0 (resending
        # costs duplicates, which dedup removes; skipping would lose records).
        self.sent = _COUNT.unpack(data[:_COUNT.size])[0] if len(data) >= _COUNT.size else 0

    def advance(self, sent: int) -> None:
        """Record durably that the first ``sent`` records were acknowledged."""
        if self._fd is None:
            make_dirs_durable(self.path.parent)
            self._fd = os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600)
            fsync_dir(self.path.parent)
        os.pwrite(self._fd, _COUNT.pack(sent), 0)  # 8 bytes in one sector: never torn
        os.fdatasync(self._fd)
        self.sent = sent

    def close(self, *, remove: bool = False) -> None:
        """Close the cursor; ``remove`` deletes it (its WAL file is gone)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if remove:
            self.path.unlink(missing_ok=True)


def remove_stale_cursors(wal_root: Path) -> int:
    """Delete cursors whose WAL file no longer exists (a crash between the two unlinks)."""
    folder = wal_root / PROGRESS
    removed = 0
    if not folder.is_dir():
        return 0
    live = {cursor_path(p).name for p in wal_root.glob("*/*.wal")}
    for path in folder.glob(f"*{CURSOR_SUFFIX}"):
        if path.name not in live:
            path.unlink(missing_ok=True)
            removed += 1
    return removed


def batches(records: list[Record], start: int, max_bytes: int) -> Iterator[tuple[int, int]]:
    """``(first, end)`` ranges from ``start``: consecutive records of one signal whose
    payloads together stay within ``max_bytes`` (a larger record goes alone).

    Serialized Export requests of one type concatenate into one valid request (protobuf
    merges repeated fields), so a batch is sent without decoding anything.
    """
    first = start
    while first < len(records):
        end, size = first + 1, len(records[first].payload)
        while (end < len(records) and records[end].signal == records[first].signal
               and size + len(records[end].payload) <= max_bytes):
            size += len(records[end].payload)
            end += 1
        yield first, end
        first = end


def dead_letter(wal_file: Path, index: int, record: Record, reason: str) -> Path:
    """Keep a record the central collector refused for good in ``wal/.quarantine/`` (as a
    one-frame WAL file, so it can be inspected or replayed by hand); never deleted."""
    folder = wal_file.parent.parent / QUARANTINE
    make_dirs_durable(folder)
    target = folder / f"forward-{wal_file.parent.name.lstrip('.')}-{wal_file.stem}-{index}" \
        f"{QUARANTINE_SUFFIX}"
    body = BODY_HEAD.pack(record.signal, record.received_ns) + record.payload
    tmp = target.with_name(f".{target.name}.tmp")
    with open(tmp, "wb") as handle:
        handle.write(FRAME_HEADER.pack(len(body), zlib.crc32(body)) + body)
        handle.flush()
        os.fsync(handle.fileno())
    os.rename(tmp, target)
    fsync_dir(folder)
    log.error("central collector refused record %d of %s for good (%s): kept as %s",
              index, wal_file, reason, target)
    return target
