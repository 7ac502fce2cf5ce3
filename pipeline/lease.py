"""The job lock of a data directory on an object store: a lease object with an expiry.

An object store has no ``flock``, and a lock that a dead holder never releases would stop every
job for good. So ``state/jobs.lock`` holds who took it and until when (``expires_unix``); it is
taken with a create-only PUT (``If-None-Match: *``), renewed by its holder every third of its
time to live, and taken over by a waiting job only once expired, with ``If-Match`` the version
it read, so two waiters cannot both take it. Its holder releases it by deleting it.

A holder that stalls longer than the time to live (``$FLEETLENS_LEASE_S``, default 60 s) loses
the lease. Every publish and delete under the data directory then calls :meth:`Lease.check`
first (:mod:`pipeline.storage.fence`), which stops the job with :class:`LeaseLost` instead of
overwriting the new holder's partitions, and its state save fails on its own conditional write
(:mod:`pipeline.state`). Expiry compares wall clocks of different hosts: keep them in sync to
well under the time to live (NTP does).

Releasing is a conditional PUT too (an expired ``released`` body, ``If-Match`` our version), not
a read then a DELETE: between those two another job may have taken the lease over, and the
DELETE would then free that job's lease under it (S3's DELETE takes no condition everywhere).
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

from fleetlens.pipeline.storage import LeaseLost, ObjectPath, VersionConflict

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
        #: Who took it over, as the lease object names them (once :attr:`lost` is set).
        self.taken_by = ""
        #: monotonic time until which the lease is surely ours: its last write's start + ttl.
        self._valid_until = 0.0
        self._write_lock = threading.Lock()  # the renewal thread and check() both write
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name="lease", daemon=True)

    def body(self, released: bool = False) -> bytes:
        return json.dumps({
            "holder": f"{os.getpid()} {self.job}", "host": socket.gethostname(),
            "token": self.token, "expires_unix": 0 if released else time.time() + self.ttl_s,
            **({"released": True} if released else {}),
        }, sort_keys=True).encode()

    def _write(self, version: str | None) -> None:
        """One conditional PUT of a fresh expiry; the lease is ours until ``ttl`` after the
        request *started* (a slow request must not stretch it)."""
        started = time.monotonic()
        self.version = self.path.put_if(self.body(), version)
        self._valid_until = started + self.ttl_s

    def take(self, version: str | None) -> bool:
        """Create the lease (``version`` None) or take over that expired version."""
        try:
            self._write(version)
        except VersionConflict:
            return False
        self._thread.start()
        return True

    def _renew_once(self) -> None:
        """Renew now; on a conflict mark the lease lost. Raises the store's OSError."""
        with self._write_lock:
            if self.lost.is_set():
                return
            try:
                self._write(self.version)
            except VersionConflict:
                current = read(self.path)
                if not self._still_ours(current):
                    self._mark_lost(current)
                    return
                # An earlier renewal landed though its answer never came (a PUT timed out at
                # 30 s on a loaded object store, then this conflicted with our own write):
                # the lease still names us, so it is renewed from its current version.
                try:
                    self._write(current[1])
                except VersionConflict:
                    self._mark_lost(read(self.path))

    def _still_ours(self, current: tuple[dict[str, Any], str | None] | None) -> bool:
        return (current is not None and current[0].get("token") == self.token
                and not is_released(current[0]))

    def _mark_lost(self, current: tuple[dict[str, Any], str | None] | None) -> None:
        data = current[0] if current else {}
        self.taken_by = f"{data.get('holder', 'another job')} on {data.get('host', '?')}" \
            if current else "another job"
        if is_released(data):
            self.taken_by += " (finished since)"
        self.lost.set()
        print(f"fleetlens: lost the job lease {self.path} to {self.taken_by} (stalled past "
              f"its {self.ttl_s:g} s?); this job publishes nothing more",
              file=sys.stderr, flush=True)

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                self._renew_once()
            except OSError as exc:  # the store is unreachable now: try again next period
                print(f"fleetlens: renewing the job lease failed: {exc}", file=sys.stderr)
            if self.lost.is_set():
                return

    def check(self) -> None:
        """Return only while the lease is surely ours for another third of its time to live.

        Costs no request while the renewal thread keeps the lease fresh (it renews every
        third, so two thirds are left); after a stall it renews here, synchronously, and that
        conditional PUT tells whether another job took the lease meanwhile.

        Raises:
            LeaseLost: another job holds the lease now, or it cannot be renewed in time.
        """
        if not self.lost.is_set() and self._valid_until - time.monotonic() >= self.ttl_s / 3:
            return
        try:
            self._renew_once()
        except OSError as exc:
            raise LeaseLost(f"cannot renew the job lease {self.path} ({exc}): this run stops "
                            "without publishing") from None
        if self.lost.is_set():
            raise LeaseLost(f"lease lost to {self.taken_by}: this run stops without "
                            f"publishing ({self.path} expired while this {self.job} stalled; "
                            "the next run redoes its work)")

    def release(self) -> None:
        """Stop renewing and free the lease if it is still ours: a conditional PUT of an
        expired body, so a lease another job took over meanwhile is left alone."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        with self._write_lock:
            if self.lost.is_set():
                return
            try:
                self.path.put_if(self.body(released=True), self.version)
            except VersionConflict:
                pass  # taken over since our last renewal: it is not ours to free
            self.taken_by = "nobody: this job released it"
            self.lost.set()  # released: any later check() refuses


def is_released(data: dict[str, Any]) -> bool:
    """Whether a lease object's contents say its holder freed it."""
    return bool(data.get("released"))


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
