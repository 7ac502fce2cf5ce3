"""The ``os`` module as the WAL sees it, with the faults of a full disk, a failing disk or a
full descriptor table (installed as ``fleetlens.collector.wal.os`` only, so nothing else in
the test process is touched).

- ``fail("open", EMFILE)``: creating a ``.wal`` file fails. First, as the kernel does when a
  listener is waiting to accept, every number the WAL closed since its last open goes to a
  socket (a squatter); :meth:`FaultyOS.squatted_bytes` is what reached those sockets.
- ``fail("write", ENOSPC)``: appending fails.
- ``fail("fsync", EIO, once=True)``: fdatasync fails once, and the bytes written since the
  file's last good fdatasync turn to zeros, as the pages Linux drops after reporting EIO read
  back after a restart. The next fdatasync succeeds: the kernel reports an error only once.
  ``fsync_gate`` holds the failing call until set, so other threads can queue up behind it.
- Every write is checked: :attr:`FaultyOS.foreign` lists each descriptor written to that was
  not a WAL file under ``root`` at that moment.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from pathlib import Path
from typing import Any


def target(fd: int) -> str:
    """What descriptor ``fd`` of this process is now (a path, ``socket:[...]``, or closed)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "<closed>"


class FaultyOS:
    """A stand-in for the ``os`` module that injects faults (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = str(root.resolve())
        self.faults: dict[str, int] = {}
        self._once: set[str] = set()
        self.foreign: list[str] = []
        self.writes = 0
        self.fsync_gate: threading.Event | None = None
        self.fsync_entered = threading.Event()
        self._closed_wal: set[int] = set()
        self._squatters: list[tuple[int, socket.socket]] = []
        self._synced: dict[tuple[int, int], int] = {}
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def fail(self, point: str, code: int, *, once: bool = False) -> None:
        """Make ``point`` ("open", "write" or "fsync") fail with errno ``code``."""
        self.faults[point] = code
        if once:
            self._once.add(point)

    def clear(self, *points: str) -> None:
        """Stop the named faults (all when none is named)."""
        for point in points or list(self.faults):
            self.faults.pop(point, None)
            self._once.discard(point)

    def _raise(self, point: str) -> None:
        code = self.faults[point]
        if point in self._once:
            self.clear(point)
        raise OSError(code, f"{os.strerror(code)} (injected {point})")

    def open(self, path: Any, flags: int, mode: int = 0o777, **kw: Any) -> int:
        if str(path).endswith(".wal") and "open" in self.faults:
            self._squat()
            self._raise("open")
        fd = os.open(path, flags, mode, **kw)
        self._closed_wal.discard(fd)
        return fd

    def close(self, fd: int) -> None:
        was_wal = target(fd).endswith(".wal")
        os.close(fd)
        if was_wal:
            self._closed_wal.add(fd)

    def write(self, fd: int, data: bytes) -> int:
        with self._lock:
            self.writes += 1
        now = target(fd)
        if not (now.startswith(self.root) and now.endswith(".wal")):
            self.foreign.append(now)
        if "write" in self.faults:
            self._raise("write")
        return os.write(fd, data)

    def fdatasync(self, fd: int) -> None:
        if "fsync" in self.faults:
            self.fsync_entered.set()
            if self.fsync_gate is not None:
                self.fsync_gate.wait(30)
            self._lose_unsynced_pages(fd)
            self._raise("fsync")
        os.fdatasync(fd)
        info = os.fstat(fd)
        self._synced[(info.st_dev, info.st_ino)] = info.st_size

    def _lose_unsynced_pages(self, fd: int) -> None:
        info = os.fstat(fd)
        start = self._synced.get((info.st_dev, info.st_ino), 0)
        if info.st_size > start:
            # a second descriptor without O_APPEND, so the zeros land where the data was
            other = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY)
            try:
                os.pwrite(other, bytes(info.st_size - start), start)
            finally:
                os.close(other)

    def _squat(self) -> None:
        for fd in sorted(self._closed_wal):
            if target(fd) != "<closed>":
                continue  # reused by the process itself meanwhile
            ours, peer = socket.socketpair()  # either may have been given ``fd`` itself
            if peer.fileno() == fd:
                ours, peer = peer, ours
            if ours.fileno() == fd:
                ours.detach()  # ``fd`` stays open as the squatter's socket
            else:
                os.dup2(ours.fileno(), fd)
                ours.close()
            peer.setblocking(False)
            self._squatters.append((fd, peer))
        self._closed_wal.clear()

    def squatted_bytes(self) -> bytes:
        """Everything written into the squatters' sockets."""
        received = b""
        for _fd, peer in self._squatters:
            with contextlib.suppress(BlockingIOError):
                received += peer.recv(1 << 20)
        return received

    def close_squatters(self) -> None:
        """Close the squatters' descriptors (those still holding their socket)."""
        for fd, peer in self._squatters:
            if target(fd).startswith("socket:"):
                with contextlib.suppress(OSError):
                    os.close(fd)
            peer.close()
        self._squatters.clear()
