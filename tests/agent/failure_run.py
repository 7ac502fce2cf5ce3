"""Helpers for inducing real failures on a real vLLM server under load
(``tests/agent/test_vllm_failures.py``), beside :mod:`tests.agent.incident_run`.

- :func:`server_tree`, :func:`kill_tree`, :func:`frozen`: the server's processes (the API
  server and the engine core it starts) SIGKILLed, or SIGSTOPped then SIGCONTed, each by
  PID, and checked in ``/proc`` to have died or stopped.
- :class:`BackgroundLoad`: an open-loop plan sent from its own thread (one asyncio loop, as
  :mod:`tests.agent.loadgen`) while the test kills, stops and restarts the server; each
  request goes to its own port (the server, or the gateway in front of it) and a request
  that fails (refused, reset) is recorded, not raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.agent import loadgen
from tests.agent.loadgen import Request
from tests.agent.vllm_env import VllmServer, _start_time, descendants


def server_tree(server: VllmServer) -> dict[int, str | None]:
    """PID -> start time (to tell it from a reused PID) of the server and its descendants."""
    pids = {server.process.pid, *descendants(server.process.pid)}
    return {pid: _start_time(pid) for pid in pids}


def _state(pid: int) -> str | None:
    """The process state letter in /proc (``T`` stopped, ``Z`` zombie), None when gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _signal(tree: dict[int, str | None], sig: signal.Signals) -> None:
    for pid, started in tree.items():
        if started is not None and _start_time(pid) == started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)


def _shared_memory(pids: Iterable[int]) -> set[Path]:
    """The /dev/shm files the processes map (vLLM's shared-memory queues, semaphores)."""
    held = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                path = line.split(maxsplit=5)[-1]
                if path.startswith("/dev/shm/"):
                    held.add(Path(path.removesuffix(" (deleted)")))
    return held


def kill_tree(server: VllmServer) -> dict[int, str | None]:
    """SIGKILL every process of ``server`` at once (a crash: no shutdown), wait for the API
    server and check that none is left alive; returns the tree that was killed. The
    shared memory it held is removed after it (a crash leaves vLLM's behind: about 420 MB
    of /dev/shm, that is of RAM, per kill on the CPU build)."""
    tree = server_tree(server)
    held = _shared_memory(tree)
    _signal(tree, signal.SIGKILL)
    server.process.wait(30)
    deadline = time.monotonic() + 30
    while any(_state(pid) not in (None, "Z") for pid in tree):
        if time.monotonic() > deadline:
            raise AssertionError(f"still alive after SIGKILL: {tree}")
        time.sleep(0.1)
    for path in held:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    return tree


@contextlib.contextmanager
def frozen(server: VllmServer) -> Iterator[dict[int, str | None]]:
    """Every process of ``server`` SIGSTOPped (checked: state ``T``) inside the block, all
    SIGCONTed on leaving it, however it is left."""
    tree = server_tree(server)
    try:
        _signal(tree, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while any(_state(pid) != "T" for pid in tree):
            if time.monotonic() > deadline:
                raise AssertionError(f"not stopped: {({p: _state(p) for p in tree})}")
            time.sleep(0.05)
        yield tree
    finally:
        _signal(tree, signal.SIGCONT)


@dataclass
class Routed:
    """One planned request and where it goes."""

    request: Request
    port: int
    via_gateway: bool
    sent: bool = False
    error: str | None = None  # the exception that failed it at the client
    done_s: float | None = None  # offset into the run when it finished (or failed)

    @property
    def ok(self) -> bool:
        return self.error is None and self.request.status == 200


class BackgroundLoad:
    """Sends ``plan`` open-loop from a thread; :meth:`stop_sending` leaves the rest unsent,
    :meth:`join` waits for what was sent. ``started_ns``: the wall clock of offset 0."""

    def __init__(self, plan: list[Routed], timeout_s: float = 600.0) -> None:
        self.plan, self.timeout_s = plan, timeout_s
        self.started_ns = 0
        self._start = 0.0
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._astop: asyncio.Event
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="load", daemon=True)
        self._failure: BaseException | None = None

    def __enter__(self) -> BackgroundLoad:
        self._thread.start()
        self._ready.wait()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_sending()
        self.join()

    def offset_s(self) -> float:
        """Seconds since offset 0."""
        return time.monotonic() - self._start

    def sleep_until(self, offset_s: float) -> None:
        time.sleep(max(0.0, offset_s - self.offset_s()))

    def stop_sending(self) -> None:
        """Send nothing more (the requests waiting for their time return at once)."""
        self._stop.set()
        if self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop just finished
                self._loop.call_soon_threadsafe(self._astop.set)

    def join(self, timeout_s: float | None = None) -> None:
        self._thread.join(timeout_s)
        if self._failure is not None:
            raise self._failure

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as exc:  # noqa: BLE001  (raised again by join)
            self._failure = exc

    async def _run(self) -> None:
        self._loop, self._astop = asyncio.get_running_loop(), asyncio.Event()
        self._start, self.started_ns = time.monotonic(), time.time_ns()
        self._ready.set()
        await asyncio.gather(*(self._one(r) for r in self.plan))

    async def _one(self, routed: Routed) -> None:
        req = routed.request
        with contextlib.suppress(TimeoutError):  # its time came
            await asyncio.wait_for(self._astop.wait(), max(0.0, req.at_s - self.offset_s()))
        if self._stop.is_set():
            return
        routed.sent, req.sent_at = True, self.offset_s()
        req.lag_s = req.sent_at - req.at_s
        try:
            await loadgen._post(routed.port, req, self.timeout_s)  # noqa: SLF001
        except (OSError, TimeoutError, IndexError, ValueError) as exc:
            routed.error = type(exc).__name__  # refused, reset, or no answer at all
        routed.done_s = self.offset_s()
        req.latency_s = routed.done_s - req.sent_at
