"""The job lock of a data directory on an object store: a lease object with an expiry.

An object store has no ``flock``, and a lock that a dead holder never releases would stop every
job for good. So ``state/jobs.lock`` holds who took it and until when (``expires_unix``); it is
taken with a create-only PUT (``If-None-Match: *``), renewed by its holder every third of its
time to live, and taken over by a waiting job only once expired, with ``If-Match`` the version
it read, so two waiters cannot both take it. Its holder releases it by deleting it.

A holder that stalls longer than the time to live (``$FLEETLENS_LEASE_S``, default 60 s) loses
the lease; its next state save then fails on its own conditional write (:mod:`pipeline.state`)
instead of overwriting the new holder's. Expiry compares wall clocks of different hosts: keep
them in sync to well under the time to live (NTP does).
"""

from __future__ import annotations

import json
import math
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from fleetlens.pipeline.storage import ObjectPath, VersionConflict

ENV_LEASE_S = "FLEETLENS_LEASE_S"
DEFAULT_LEASE_S = 60.0
#: No holder renews its lease further ahead than this: a later expiry is garbage (issue 33).
MAX_AHEAD_S = 24 * 3600.0


def lease_seconds() -> float:
    """The lease's time to live: ``$FLEETLENS_LEASE_S`` or 60 s (at least 1 s)."""
    try:
        return max(1.0, float(os.environ.get(ENV_LEASE_S) or DEFAULT_LEASE_S))
    except ValueError:
        return DEFAULT_LEASE_S


def read(path: ObjectPath) -> tuple[dict[str, Any], str | None] | None:
    """The lease's contents and version, or None when nobody holds it."""
    try:
        body, version = path.read_versioned()
    except FileNotFoundError:
        return None
    try:
        data = json.loads(body)
    except ValueError:
        data = {}
    return (data if isinstance(data, dict) else {}), version


class Lease:
    """A held lease, renewed on a daemon thread until :meth:`release`."""

    def __init__(self, path: ObjectPath, job: str, ttl_s: float) -> None:
        self.path = path
        self.job = job
        self.ttl_s = ttl_s
        self.token = secrets.token_hex(8)
        self.version: str | None = None
        #: Set when a renewal found the lease taken by another job.
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name="lease", daemon=True)

    def body(self) -> bytes:
        return json.dumps({
            "holder": f"{os.getpid()} {self.job}", "host": socket.gethostname(),
            "token": self.token, "expires_unix": time.time() + self.ttl_s,
        }, sort_keys=True).encode()

    def take(self, version: str | None) -> bool:
        """Create the lease (``version`` None) or take over that expired version."""
        try:
            self.version = self.path.put_if(self.body(), version)
        except VersionConflict:
            return False
        self._thread.start()
        return True

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                self.version = self.path.put_if(self.body(), self.version)
            except VersionConflict:
                self.lost.set()
                print(f"fleetlens: lost the job lease {self.path} (stalled past its "
                      f"{self.ttl_s:g} s?); state saves of this job will fail",
                      file=sys.stderr, flush=True)
                return
            except OSError as exc:  # the store is unreachable now: try again next period
                print(f"fleetlens: renewing the job lease failed: {exc}", file=sys.stderr)

    def release(self) -> None:
        """Stop renewing and delete the lease if it is still ours."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        current = read(self.path)
        if current is not None and current[0].get("token") == self.token:
            self.path.unlink(missing_ok=True)


def acquire(path: ObjectPath, job: str, on_wait: Callable[[str], None] | None,
            ttl_s: float | None = None, poll_s: float | None = None) -> Lease:
    """Take the lease at ``path``, waiting while another job holds an unexpired one."""
    ttl = ttl_s if ttl_s is not None else lease_seconds()
    poll = poll_s if poll_s is not None else min(1.0, ttl / 10)
    said = False
    while True:
        lease = Lease(path, job, ttl)
        current = read(path)
        if current is None:
            if lease.take(None):
                return lease
            continue
        data, version = current
        expires = data.get("expires_unix")
        # NaN compares false and 1e308 never comes: either would hold every job off for good.
        if not isinstance(expires, int | float) or not math.isfinite(expires) \
                or not time.time() <= expires <= time.time() + MAX_AHEAD_S:
            if lease.take(version):  # expired (or unreadable): take it over
                return lease
            continue
        if not said and on_wait is not None:
            on_wait(f"waiting for {data.get('holder', 'another job')} on "
                    f"{data.get('host', '?')} to finish with {path.parent.parent} ({path})")
            said = True
        time.sleep(poll)
