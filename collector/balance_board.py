"""What the workers share to balance Exports by work (see :mod:`collector.balance`).

Kept apart from the dispatcher so the supervisor can create it before it forks without
importing gRPC or Arrow: a shared array (one row per worker: Exports running there, and
whether it serves its peers now) and a private folder for the workers' Unix sockets.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Name of a sockets' folder: ``<PREFIX><supervisor pid>-<random>`` in the temporary folder.
PREFIX = "fleetlens-peers-"


@dataclass(frozen=True)
class PeerSetup:
    """The shared state of ``count`` workers: ``board`` and their sockets' folder."""

    board: Any
    directory: str
    count: int

    def socket_path(self, slot: int) -> str:
        """The Unix socket on which worker ``slot`` takes Exports from its peers."""
        return str(Path(self.directory) / f"w{slot}.sock")

    def running(self, slot: int) -> float:
        """Exports worker ``slot`` is running now (decode, WAL, fsync)."""
        return self.board[slot]

    def set_running(self, slot: int, value: int) -> None:
        # Only the worker itself writes its row: no write races between processes.
        self.board[slot] = value

    def serving(self, slot: int) -> bool:
        """True while worker ``slot`` takes Exports from its peers."""
        return bool(self.board[self.count + slot])

    def set_serving(self, slot: int, on: bool) -> None:
        self.board[self.count + slot] = 1.0 if on else 0.0


def create(count: int) -> PeerSetup:
    """The shared state of ``count`` workers, made before they are forked.

    The sockets' folder is made by ``mkdtemp`` (mode 0700): only this user can reach a
    worker's socket, who could write to its WAL directly anyway. A socket with a name in
    the abstract namespace would be reachable by every local user, bypassing the token.
    Its name carries the supervisor's pid, so folders of killed collectors (SIGKILL skips
    :func:`remove`) are found and removed here.
    """
    remove_stale()
    board = multiprocessing.get_context("spawn").RawArray("d", 2 * count)
    folder = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-")
    return PeerSetup(board, folder, count)


def remove_stale(parent: str | None = None) -> int:
    """Remove this user's socket folders whose supervisor is gone; returns how many.

    A pid reused since is taken as alive: that folder stays (two empty sockets), nothing
    else is lost.
    """
    removed = 0
    for folder in Path(parent or tempfile.gettempdir()).glob(f"{PREFIX}*-*"):
        pid = folder.name[len(PREFIX):].split("-", 1)[0]
        try:
            if not pid.isdigit() or folder.stat().st_uid != os.geteuid():
                continue
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
        except OSError:  # gone meanwhile, or the pid belongs to another user: alive
            continue
    return removed


def remove(setup: PeerSetup) -> None:
    """Delete the sockets' folder (when every worker has stopped)."""
    shutil.rmtree(setup.directory, ignore_errors=True)
