"""One writing job at a time per data directory.

The pipeline, ``fleetlens compact`` and the analytics all rewrite files under ``derived/`` and
``state/``, and compaction deletes raw segments the pipeline may be reading. Each takes this
lock (``state/jobs.lock``, an advisory ``flock``) for the whole of its run, so that, for
example, an hourly ``fleetlens compact`` from cron waits for a running ``pipeline --follow``
step instead of deleting the segments under it or overwriting its ``state/pipeline.json``.

Readers (the dashboard, ``fleetlens sql``) never take it: they must not wait for a job.

The kernel drops a ``flock`` when its holder dies, so a crashed job never leaves a stale lock.
Within one process the lock is re-entrant for the thread holding it (the pipeline's
``--follow`` loop runs the analytics inside its own step) and excludes other threads.

On an object store (``s3://`` data directory) the same ``state/jobs.lock`` is a lease object
with an expiry instead (:mod:`pipeline.lease`): a dead holder's lease runs out, and so does a
stalled one's. While the lease is held, every object write and delete under the data
directory checks it first (:mod:`pipeline.storage.fence`), so a job that lost it stops with
``LeaseLost`` instead of publishing over the job that took it over.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from fleetlens.pipeline.storage import DataDir, StorageError, fence, is_remote

LOCK_NAME = "jobs.lock"

_GUARD = threading.Lock()
#: Per lock file: this process's holder (a thread-re-entrant mutex, the open file, the depth).
_HELD: dict[Path, _ProcessHold] = {}


class _ProcessHold:
    def __init__(self) -> None:
        self.mutex = threading.RLock()
        self.depth = 0
        self.fd: int | None = None
        self.lease: Any = None  # a pipeline.lease.Lease on an object store
        self.fence: contextlib.ExitStack | None = None  # its fence.guarded() block


def lock_path(data_dir: DataDir) -> Path:
    """The lock file of ``data_dir``."""
    return data_dir.state / LOCK_NAME


def holder(data_dir: DataDir) -> str:
    """Who holds the lock, as its holder wrote it (``pid command``), or ``""``."""
    if data_dir.remote:
        from fleetlens.pipeline import lease

        try:
            current = lease.read(lock_path(data_dir))  # type: ignore[arg-type]
        except OSError:
            return ""
        if current is None or lease.is_released(current[0]):
            return ""
        return str(current[0].get("holder", ""))
    try:
        return lock_path(data_dir).read_text().strip()
    except OSError:
        return ""


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@contextlib.contextmanager
def exclusive(data_dir: DataDir, job: str,
              on_wait: Callable[[str], None] | None = _say) -> Iterator[None]:
    """Hold the data directory's job lock for the ``with`` block, waiting for it if needed.

    Args:
        data_dir: the data directory.
        job: what this holder is (``pipeline``, ``compact``, ``analytics``), recorded in the
            lock file for whoever waits.
        on_wait: called once with a message when another process holds the lock (default:
            printed on stderr); ``None`` waits silently.
    """
    path = lock_path(data_dir)
    with _GUARD:
        hold = _HELD.setdefault(path, _ProcessHold())
    with hold.mutex:
        if hold.depth == 0 and is_remote(path):
            from fleetlens.pipeline import lease

            hold.lease = lease.acquire(path, job, on_wait)  # type: ignore[arg-type]
            hold.fence = contextlib.ExitStack()
            hold.fence.enter_context(fence.guarded(data_dir.root, hold.lease.check))
        elif hold.depth == 0:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise StorageError(
                    f"cannot take the job lock {path}: {exc.strerror} ({job} writes to the "
                    "data directory: is it read-only, or is state/ not a folder?)") from None
            try:
                _acquire(fd, data_dir, on_wait)
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()} {job}\n".encode(), 0)
            except BaseException:
                os.close(fd)
                raise
            hold.fd = fd
        hold.depth += 1
        try:
            yield
        finally:
            hold.depth -= 1
            if hold.depth == 0 and hold.fd is not None:
                os.close(hold.fd)  # closing the last descriptor releases the flock
                hold.fd = None
            if hold.depth == 0 and hold.lease is not None:
                if hold.fence is not None:
                    hold.fence.close()
                    hold.fence = None
                hold.lease.release()
                hold.lease = None


def _held() -> None:
    """A ``flock``'s check: the kernel holds it until the process exits, it cannot be lost."""


@contextlib.contextmanager
def file_lock(path: Path, job: str) -> Iterator[Callable[[], None]]:
    """Hold an exclusive lock named ``path`` for the ``with`` block, waiting silently: a
    ``flock`` on a local file, a lease object (:mod:`pipeline.lease`) on an object store.
    For locks other than the job lock (e.g. the webhook deliveries' state).

    Yields:
        A check to call before each action the lock guards (a webhook post): it raises
        ``LeaseLost`` once a lease was taken over by another process (a ``flock``'s never).
    """
    if is_remote(path):
        from fleetlens.pipeline import lease

        held = lease.acquire(path, job, None)  # type: ignore[arg-type]
        try:
            yield held.check
        finally:
            held.release()
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released by the kernel if this process dies
        yield _held
    finally:
        os.close(fd)


def _acquire(fd: int, data_dir: DataDir, on_wait: Callable[[str], None] | None) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        pass
    if on_wait is not None:
        who = holder(data_dir) or "another job"
        on_wait(f"waiting for {who} to finish with {data_dir.root} ({lock_path(data_dir)})")
    fcntl.flock(fd, fcntl.LOCK_EX)
