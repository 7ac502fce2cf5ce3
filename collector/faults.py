"""Fault injection for the collector's storage path (tests and drills only).

Set ``FLEETLENS_FAULTS`` to a file path in a collector's environment. While that file exists,
each line ``<point> <ERRNO>`` makes the named operation fail with that errno, as the kernel
would; ``<point> KILL`` SIGKILLs the process there instead. Points:

    wal.open       creating a WAL segment (EMFILE: the descriptor table is full)
    wal.write      appending a frame (ENOSPC, EIO)
    wal.fsync      fdatasync of a WAL segment (EIO: the kernel lost dirty pages)
    publish        writing one raw Parquet segment (ENOSPC, EIO)
    publish.after  after one raw Parquet segment is published (KILL: killed mid-publish)

The file is re-read when its modification time changes, so a test can start and stop a fault
in a running process. Without the variable every check is a single attribute test.
"""

from __future__ import annotations

import errno
import os
import signal

FAULTS_ENV = "FLEETLENS_FAULTS"


class Faults:
    """The faults named by one rules file (see the module docstring)."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._rules: dict[str, str] = {}

    @classmethod
    def from_env(cls) -> Faults:
        """The faults named by ``$FLEETLENS_FAULTS`` (none when unset)."""
        return cls(os.environ.get(FAULTS_ENV) or None)

    def _load(self) -> dict[str, str]:
        assert self.path is not None
        try:
            info = os.stat(self.path)
            stamp = (info.st_mtime_ns, info.st_size)  # the size too: coarse clocks
        except FileNotFoundError:
            self._stamp, self._rules = None, {}
            return self._rules
        if stamp != self._stamp:
            with open(self.path) as handle:
                lines = [line.split() for line in handle if line.strip()]
            self._stamp = stamp
            self._rules = {parts[0]: parts[1].upper() for parts in lines if len(parts) >= 2}
        return self._rules

    def check(self, point: str) -> None:
        """Raise the injected error for ``point`` (or die there), if one is set.

        Raises:
            OSError: with the errno the rules file names for ``point``.
        """
        if self.path is None:
            return
        action = self._load().get(point)
        if action is None:
            return
        if action == "KILL":
            os.kill(os.getpid(), signal.SIGKILL)
        code = getattr(errno, action, None)
        if not isinstance(code, int):
            raise ValueError(f"{self.path}: unknown fault {action!r} for {point}")
        raise OSError(code, f"{os.strerror(code)} (injected at {point})")
