"""Fencing: a job that lost its lease publishes nothing more under the data directory.

On an object store the job lock is a lease with an expiry (:mod:`pipeline.lease`). A job that
stalls past it (a paused VM, SIGSTOP, a swap storm) loses it to the next job, then wakes up and
would go on overwriting derived partitions under the new holder (issue 33 item 6). So while a
job holds the lease, :func:`guarded` registers the lease's check for the data directory's root,
and every unconditional write and delete of an object under that root (``ObjectPath``'s
``write_bytes``, ``unlink``, ``remove_tree``) runs the check first: it raises
:class:`LeaseLost` once the lease is gone, and nothing is published.

Why a check before each publish rather than a generation number readers honour: readers are
DuckDB and Polars globs over Parquet files (DESIGN.md section 2), ours and the users' own; a
generation would need a manifest every reader consults, a new file interface. The check costs
no request while the lease is fresh (its renewal thread keeps it so) and one conditional PUT
when it is not (:meth:`pipeline.lease.Lease.check`). What it leaves open: a process that stalls
*between* a passed check and the PUT's arrival for longer than the lease's remaining third
(20 s by default) can still land that one PUT; the state save is a conditional write and never
lands stale, so the new holder's run is not undone.

A local data directory registers nothing: its lock is a ``flock`` the kernel holds until the
process exits, so a stalled local job cannot lose it (the next job waits instead).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

from fleetlens.pipeline.storage.base import StorageError


class LeaseLost(StorageError):
    """This process's job lease was taken over (or cannot be confirmed): the job must stop
    without publishing anything more."""


_GUARD = threading.Lock()
#: Data-directory root (``s3://bucket/prefix``) -> the check of the lease held on it.
_CHECKS: dict[str, Callable[[], None]] = {}


@contextlib.contextmanager
def guarded(root: object, check: Callable[[], None]) -> Iterator[None]:
    """Run ``check`` before every object write and delete under ``root`` in this process
    during the ``with`` block (the job lock holds one such block per data directory)."""
    key = str(root).rstrip("/")
    with _GUARD:
        _CHECKS[key] = check
    try:
        yield
    finally:
        with _GUARD:
            if _CHECKS.get(key) is check:
                del _CHECKS[key]


def check(path: object) -> None:
    """Raise :class:`LeaseLost` if ``path`` lies under a data directory whose lease this
    process held and lost; nothing (and no request) otherwise."""
    if not _CHECKS:
        return
    where = str(path)
    with _GUARD:
        checks = [fn for root, fn in _CHECKS.items()
                  if where == root or where.startswith(root + "/")]
    for fn in checks:
        fn()
