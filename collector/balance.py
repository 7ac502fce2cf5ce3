"""Balance Exports by work, not by connection (issue 34).

The kernel pins each client connection to the worker that accepted it (SO_REUSEPORT), and
real senders are few and long-lived (edge collectors, a gateway, one agent per host): one
worker may run every Export while the others idle. Here the worker holding the connection
keeps what only it can do (TLS, HTTP/2 or HTTP/1.1 framing, the token check) and, when
another worker is running fewer Exports at that moment, hands it the raw request over a
Unix socket. That worker runs the whole Export exactly as for its own connections (parse,
validate, WAL append, group fsync, partial success) and its answer is relayed unchanged:

- OK only after the WAL of the worker that decoded the request is synced;
- refusals cross as their class (:mod:`collector.balance_wire`): permanent stays permanent;
- a peer that cannot be reached before the request is sent leaves it here (nothing lost,
  nothing twice); one that dies after it was sent makes the Export fail retryable
  (UNAVAILABLE), never OK: the client resends, and at most a duplicate is stored, which the
  pipeline removes (at least once, as after any crash).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable, Iterator

from fleetlens.collector.balance_board import PeerSetup
from fleetlens.collector.balance_wire import (
    read_reply,
    read_request,
    reply_ok,
    reply_refused,
    request_frame,
)
from fleetlens.collector.errors import ExportError, StorageFailure
from fleetlens.collector.telemetry import log

#: Seconds a worker waits for a peer's answer (its WAL fsync included) before refusing the
#: Export as retryable; far above any healthy Export, below OTLP clients' usual deadlines.
PEER_TIMEOUT_S = 30.0
#: Exports a worker runs at once from which it counts as busy: one decodes while the other
#: waits for its WAL fsync, so two keep a core working (see :meth:`Balancer.pick`).
BUSY = 2
#: ``handle(signal code, transport, peer, payload) -> response bytes``; raises ExportError.
Handler = Callable[[int, str, "str | None", bytes], bytes]


def descriptors(setup: PeerSetup | None, threads: int) -> int:
    """File descriptors the balancing may hold in one worker: a connection to each peer per
    Export thread (``threads``: gRPC and HTTP together), as many accepted from the peers,
    and the listening socket. Kept from what OTLP/HTTP connections may take."""
    return 0 if setup is None else 2 * threads * (setup.count - 1) + 1


class Balancer:
    """One worker's side: counts its running Exports and hands requests to idler peers."""

    def __init__(self, setup: PeerSetup, slot: int) -> None:
        self.setup = setup
        self.slot = slot
        self._running = 0
        self._lock = threading.Lock()
        self._local = threading.local()  # per thread: peer slot -> connected socket
        setup.set_running(slot, 0)  # a predecessor killed mid-Export may have left a count

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Count an Export run here (own connection or a peer's) on the shared board."""
        with self._lock:
            self._running += 1
            self.setup.set_running(self.slot, self._running)
        try:
            yield
        finally:
            with self._lock:
                self._running -= 1
                self.setup.set_running(self.slot, self._running)

    def pick(self) -> int | None:
        """A serving peer to hand the next Export to, or None to run it here.

        The peer running the fewest Exports, when that is fewer than this worker runs and
        fewer than :data:`BUSY`. Ties stay here: one request in flight has nothing to spread,
        and a hop only adds latency. And a worker already running ``BUSY`` Exports has its
        core: handing it more (each peer's Export threads come on top of its own gRPC and
        HTTP threads) only adds threads that wait for the same GIL. Measured with 32
        connections on 2 workers (issue 34): handing over on "fewer" alone cost 10% of the
        saturated throughput and took the open-loop p99 at 50k spans/s from 0.35 s to 2.2 s.
        """
        setup, best, fewest = self.setup, None, min(self.setup.running(self.slot), BUSY)
        for other in range(setup.count):
            if other != self.slot and setup.serving(other) and setup.running(other) < fewest:
                best, fewest = other, setup.running(other)
        return best

    def send(self, target: int, code: int, transport: str, peer: str | None,
             payload: bytes) -> bytes | None:
        """Run an Export on worker ``target``; its response bytes, or None when the request
        could not be handed over (then it was not stored there: run it here).

        Raises:
            ExportError: ``target`` refused it, or went away after taking it (retryable).
        """
        sock = self.hand_over(target, code, transport, peer, payload)
        return None if sock is None else self.answer(target, sock)

    def hand_over(self, target: int, code: int, transport: str, peer: str | None,
                  payload: bytes) -> socket.socket | None:
        """Send a request to ``target`` without waiting; the socket to :meth:`answer` on, or
        None when it could not be sent whole (then it was not stored there)."""
        conns: dict[int, socket.socket] = self._local.__dict__.setdefault("conns", {})
        sock = conns.get(target)
        try:
            if sock is None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                conns[target] = sock
                sock.settimeout(PEER_TIMEOUT_S)
                sock.connect(self.setup.socket_path(target))
            sock.sendall(request_frame(code, transport, peer, len(payload)))
            sock.sendall(payload)
        except OSError:
            # Not taken whole (a peer restarting or stopping): a partial frame is dropped
            # there unread. A stale socket of a replaced peer fails here too.
            self._drop(conns, target)
            return None
        return sock

    def answer(self, target: int, sock: socket.socket) -> bytes:
        """The response bytes of the request :meth:`hand_over` sent on ``sock``.

        Raises:
            ExportError: ``target`` refused it, or went away after taking it (retryable).
        """
        try:
            return read_reply(sock)
        except ExportError:
            raise
        except (OSError, EOFError, ValueError) as exc:
            self._drop(self._local.__dict__.setdefault("conns", {}), target)
            raise StorageFailure(f"worker {target} stopped while storing this request "
                                 f"({type(exc).__name__}); retry") from None

    def close(self) -> None:
        """Close the calling thread's connections to its peers."""
        conns: dict[int, socket.socket] = self._local.__dict__.get("conns", {})
        for target in list(conns):
            self._drop(conns, target)

    @staticmethod
    def _drop(conns: dict[int, socket.socket], target: int) -> None:
        sock = conns.pop(target, None)
        if sock is not None:
            sock.close()


class PeerServer:
    """Takes Exports from the other workers on this worker's Unix socket."""

    def __init__(self, setup: PeerSetup, slot: int, handle: Handler, max_bytes: int) -> None:
        self.setup, self.slot, self.handle, self.max_bytes = setup, slot, handle, max_bytes
        path = setup.socket_path(slot)
        # A temporary-files cleaner may have removed the folder of a long-running collector.
        os.makedirs(setup.directory, mode=0o700, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # left by this slot's predecessor (killed)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.bind(path)
        except OSError:
            self.sock.close()
            raise
        self.sock.listen(64)
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name="peers", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self.setup.set_serving(self.slot, True)

    def stop_taking(self) -> None:
        """Peers stop choosing this worker (it drains); requests already sent are served."""
        self.setup.set_serving(self.slot, False)

    def close(self) -> None:
        """Stop accepting (connections already taken are served to their end)."""
        self.stop_taking()
        self._closed = True
        self.sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.sock.accept()
            except OSError as exc:  # EMFILE: peers fall back to running Exports themselves
                if self._closed:
                    return
                log.warning("peer socket accept failed: %s", exc)
                threading.Event().wait(1.0)
                continue
            threading.Thread(target=self._serve, args=(conn,), name="peer-export",
                             daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            while True:
                try:
                    code, transport, peer, payload = read_request(conn, self.max_bytes)
                except (EOFError, OSError, ValueError):
                    return  # the peer is done (or sent what no worker sends)
                try:
                    reply = reply_ok(self.handle(code, transport, peer, payload))
                except ExportError as error:
                    reply = reply_refused(error)
                except Exception as exc:  # a bug: never OK, retryable, and said in the log
                    log.exception("Export from a peer worker failed unexpectedly")
                    reply = reply_refused(StorageFailure(f"internal error: "
                                                         f"{type(exc).__name__}"))
                try:
                    conn.sendall(reply)
                except OSError:
                    return
