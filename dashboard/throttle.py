"""Failed-login throttling: after a few wrong passwords, each try must wait longer.

Kept per client address for the whole server process (a new browser session does not reset
it). The first ``free`` failures cost nothing (typos); after that the wait doubles with each
failure up to ``cap_s``. While a client must wait, its tries are refused without checking the
password, so guessing is slowed to one try per wait. A success clears the client's record.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field


@dataclass
class Throttle:
    """Failures and the earliest next try, per client."""

    free: int = 3
    base_s: float = 2.0
    cap_s: float = 300.0
    clock: object = time.monotonic
    _failures: dict[str, tuple[int, float]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def wait_s(self, client: str) -> float:
        """Seconds ``client`` must still wait before its next try is checked (0: go)."""
        with self._lock:
            _, until = self._failures.get(client, (0, 0.0))
        return max(0.0, until - self.clock())

    def failed(self, client: str) -> float:
        """Record a wrong password; return the wait it imposes on the next try."""
        with self._lock:
            count, _ = self._failures.get(client, (0, 0.0))
            count += 1
            extra = count - self.free
            wait = 0.0 if extra <= 0 else min(self.cap_s, self.base_s * 2 ** (extra - 1))
            self._failures[client] = (count, self.clock() + wait)
            if len(self._failures) > 10_000:  # bounded memory under a spray of addresses
                self._failures.pop(next(iter(self._failures)))
        return wait

    def succeeded(self, client: str) -> None:
        """Forget ``client``'s failures."""
        with self._lock:
            self._failures.pop(client, None)
