"""Edge mode: when refusals say the central collector is broken, and what quarantine costs.

One request the central collector refuses for good is kept apart in ``wal/.quarantine/`` and
forwarding goes on: that request is the problem. A central collector that refuses *every*
request for good (broken, misconfigured, hostile) would otherwise empty the edge into its
quarantine, one request at a time, and make room for more. So:

- :class:`RefusalStreak`: after ``forward.max_refused_in_a_row`` permanent refusals in a row,
  the central collector is unhealthy, not the data. Nothing more is quarantined; the record
  stays in the WAL and is offered again at the slow retry pace; an error is logged and the
  ``forward_central_unhealthy`` gauge is 1 until the central collector accepts one again.
- :class:`QuarantineSize`: quarantined bytes stay on the edge's disk until a human removes
  them, so they count against ``forward.max_pending_bytes`` like WAL bytes not yet forwarded.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from fleetlens.collector.telemetry import Telemetry, log
from fleetlens.collector.wal_files import QUARANTINE

#: Seconds a measured quarantine size is reused by ``accept`` (the folder is shared by the
#: workers; this worker's own additions refresh it at once).
SIZE_TTL_S = 1.0


class RefusalStreak:
    """Permanent refusals in a row from the central collector, and what they mean."""

    def __init__(self, limit: int, address: str, telemetry: Telemetry) -> None:
        self.limit = limit
        self.address = address
        self.telemetry = telemetry
        self.in_a_row = 0
        self.unhealthy = False

    def refused(self, detail: str) -> bool:
        """Count one permanent refusal of a single request.

        Returns:
            True when the request may be quarantined (the data are to blame); False when
            the central collector is unhealthy: keep the request in the WAL, retry later.
        """
        self.in_a_row += 1
        if self.in_a_row < self.limit:
            return True
        if not self.unhealthy:
            self.unhealthy = True
            self.telemetry.set("forward_central_unhealthy", 1)
            log.error("central collector %s refused %d requests in a row for good (last: %s): "
                      "treated as unhealthy, not as bad data; nothing more is quarantined, "
                      "forwarding stops and the WAL keeps everything (Exports are refused once "
                      "forward.max_pending_bytes is reached) until it accepts a request again",
                      self.address, self.in_a_row, detail)
        return False

    def accepted(self) -> None:
        """The central collector stored a request: the streak is over."""
        if self.unhealthy:
            log.info("central collector %s accepts requests again after %d refusals in a row",
                     self.address, self.in_a_row)
            self.telemetry.set("forward_central_unhealthy", 0)
        self.in_a_row, self.unhealthy = 0, False


class QuarantineSize:
    """Bytes in ``wal/.quarantine/`` (shared by all workers), measured at most once a second."""

    def __init__(self, wal_root: Path) -> None:
        self.folder = wal_root / QUARANTINE
        self._bytes = 0
        self._at: float | None = None

    def bytes(self) -> int:
        """The folder's size in bytes (files that vanish while measured count as 0)."""
        now = time.monotonic()
        if self._at is None or now - self._at >= SIZE_TTL_S:
            self._bytes, self._at = _folder_bytes(self.folder), now
        return self._bytes

    def grew(self) -> None:
        """This worker quarantined something: measure again on the next call."""
        self._at = None


def _folder_bytes(folder: Path) -> int:
    total = 0
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return 0
    for entry in entries:
        try:
            total += entry.stat(follow_symlinks=False).st_size
        except FileNotFoundError:
            continue
    return total
