"""The collector's own metrics on their own port (``self_metrics_address``, default
127.0.0.1:8888, the OpenTelemetry Collector's default), without the ingest token.

``GET /metrics`` answers, in Prometheus text format, the receiver counters under the OTel
Collector's names (``otelcol_receiver_accepted_spans_total{receiver="otlp"}``...), the
``fleetlens_collector_*`` series that ``/metrics`` on the OTLP/HTTP port serves behind the
token, and ``process_*`` summed over the supervisor and every worker.

With several workers the supervisor binds the socket once, before it forks, and every worker
accepts on it: whichever worker answers reads the shared telemetry array (one row per
worker) and ``/proc`` of the whole process tree, so every answer covers the whole collector.
Binding once also means a second collector on the same host gets a clear "address in use"
instead of silently sharing the port (as SO_REUSEPORT would let it). A port in use turns
self-metrics off with one error line; it never stops the collector from ingesting.

Each worker holds at most :data:`SCRAPE_SLOTS` scrape connections and gives each
:data:`SCRAPE_DEADLINE_S` from accept to answer (:class:`ScrapeServer`): scrapes can never
take the descriptors that ingest, the WAL and publishing need.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from fleetlens.collector.telemetry import Telemetry, log
from fleetlens.pipeline.schema.settings import is_loopback

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_TEXT = "text/plain; charset=utf-8"
#: Scrape connections one worker holds at once (its descriptors for this port).
SCRAPE_SLOTS = 4
#: Seconds from accepting a scrape to the end of its answer; a slower client is dropped.
SCRAPE_DEADLINE_S = 5.0
#: Largest request head read (a scraper sends a few hundred bytes).
MAX_HEAD_BYTES = 16 * 1024
_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def bind(address: str) -> socket.socket | None:
    """A listening socket on ``HOST:PORT``, or None (logged) when it cannot be bound."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, int(port)))
            sock.listen(64)
        except OSError:
            sock.close()
            raise
    except OSError as exc:
        log.error("self-metrics off: cannot listen on %s (%s); set self_metrics_address to "
                  "another HOST:PORT, or \"\" to silence this", address, exc.strerror or exc)
        return None
    # Non-blocking: every worker waits on this one socket, and a worker that loses the race
    # for a connection must get EAGAIN rather than block in accept().
    sock.setblocking(False)
    if not is_loopback(host, resolve=True):
        log.warning("self-metrics on %s are not loopback: anyone who reaches it can read "
                    "the collector's counters (no token is asked)", address)
    return sock


@dataclass
class ProcStat:
    """What ``process_*`` reports for one process."""

    cpu_seconds: float
    rss_bytes: int
    virtual_bytes: int
    open_fds: int
    start_time_s: float


def _boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return 0.0


def read_proc(pid: int) -> ProcStat | None:
    """``/proc/<pid>`` figures, or None when the process is gone (a worker restarting)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # Fields after the command name (which may itself hold spaces and parentheses);
    # rest[0] is field 3 (state), so field n is rest[n - 3].
    rest = stat[stat.rindex(")") + 2:].split()
    return ProcStat(cpu_seconds=(int(rest[11]) + int(rest[12])) / _TICKS,
                    rss_bytes=int(rest[21]) * _PAGE, virtual_bytes=int(rest[20]),
                    open_fds=fds, start_time_s=_boot_time() + int(rest[19]) / _TICKS)


def collector_pids(supervisor_pid: int) -> list[int]:
    """The supervisor and its child processes (the workers)."""
    pids = [supervisor_pid]
    try:
        tasks = os.listdir(f"/proc/{supervisor_pid}/task")
    except FileNotFoundError:
        return pids
    for task in tasks:
        try:
            children = Path(f"/proc/{supervisor_pid}/task/{task}/children").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        pids += [int(child) for child in children.split()]
    return pids


def max_fds(pid: int) -> int | None:
    """The soft limit on open files of ``pid``."""
    try:
        for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
            if line.startswith("Max open files"):
                value = line.split()[3]
                return int(value) if value.isdigit() else None
    except FileNotFoundError:
        return None
    return None


def process_metrics(supervisor_pid: int) -> str:
    """``process_*`` over the supervisor and every worker (sums; start time and max fds are
    the supervisor's)."""
    pids = collector_pids(supervisor_pid)
    stats = [s for s in (read_proc(pid) for pid in pids) if s is not None]
    series: list[tuple[str, str, str, float]] = [
        ("process_cpu_seconds_total", "counter",
         "User and system CPU time of the supervisor and every worker, in seconds.",
         sum(s.cpu_seconds for s in stats)),
        ("process_resident_memory_bytes", "gauge",
         "Resident memory of the supervisor and every worker, summed.",
         sum(s.rss_bytes for s in stats)),
        ("process_virtual_memory_bytes", "gauge",
         "Virtual memory of the supervisor and every worker, summed.",
         sum(s.virtual_bytes for s in stats)),
        ("process_open_fds", "gauge", "Open file descriptors of the supervisor and every "
         "worker, summed.", sum(s.open_fds for s in stats)),
        ("fleetlens_collector_processes", "gauge", "Processes counted in process_* "
         "(the supervisor and its workers).", len(stats)),
    ]
    supervisor = read_proc(supervisor_pid)
    if supervisor is not None:
        series.append(("process_start_time_seconds", "gauge", "Start time of the collector "
                       "(its supervisor) since the Unix epoch, in seconds.",
                       supervisor.start_time_s))
    limit = max_fds(supervisor_pid)
    if limit is not None:
        series.append(("process_max_fds", "gauge", "Open file limit of one process.", limit))
    lines = []
    for name, kind, text, value in series:
        family = name.removesuffix("_total") if kind == "counter" else name
        lines += [f"# HELP {family} {text}", f"# TYPE {family} {kind}", f"{name} {value:.17g}"]
    return "\n".join(lines) + "\n"


def render(telemetry: Telemetry, supervisor_pid: int) -> str:
    """The whole exposition answered on the self-metrics port."""
    return telemetry.otelcol() + process_metrics(supervisor_pid) + telemetry.prometheus()


class ScrapeServer:
    """``GET /metrics`` on a shared listening socket, with :data:`SCRAPE_SLOTS` connections at
    most and :data:`SCRAPE_DEADLINE_S` for a whole request, from accept to answer.

    Not ``http.server``: its ``ThreadingHTTPServer`` accepted every connection into a thread
    of its own with a per-``recv`` timeout, so trickling clients took the worker's descriptors
    (issue 33). Here a connection past the slots is not accepted at all: it waits in the
    kernel's listen backlog, which costs this worker no descriptor.
    """

    def __init__(self, sock: socket.socket, telemetry: Telemetry, supervisor_pid: int) -> None:
        self.sock = sock
        self.telemetry = telemetry
        self.supervisor_pid = supervisor_pid
        self.slots = threading.BoundedSemaphore(SCRAPE_SLOTS)
        self._last_error = 0.0

    def serve_forever(self) -> None:
        """Accept and answer scrapes, one thread per slot in use (runs until the process ends)."""
        while True:
            self.slots.acquire()
            conn = self._accept()
            threading.Thread(target=self._answer, args=(conn,), name="self-metrics-scrape",
                             daemon=True).start()

    def _accept(self) -> socket.socket:
        poller = select.poll()  # not select(): a descriptor may be numbered past 1,024
        poller.register(self.sock, select.POLLIN)
        while True:
            poller.poll()
            try:
                conn, _ = self.sock.accept()
                return conn
            except BlockingIOError:
                continue  # another worker took this connection
            except OSError as exc:  # EMFILE: wait rather than spin, say so once a minute
                now = time.monotonic()
                if now - self._last_error >= 60.0:
                    self._last_error = now
                    log.warning("self-metrics: cannot accept (%s)", exc.strerror or exc)
                time.sleep(1.0)

    def _answer(self, conn: socket.socket) -> None:
        deadline = time.monotonic() + SCRAPE_DEADLINE_S
        try:
            head = b""
            while b"\r\n\r\n" not in head:
                left = deadline - time.monotonic()
                if left <= 0 or len(head) > MAX_HEAD_BYTES:
                    return  # too slow or too long: dropped unanswered
                conn.settimeout(left)
                chunk = conn.recv(4096)
                if not chunk:
                    return
                head += chunk
            status, body, content_type = self._reply_to(head.split(b"\r\n", 1)[0])
            conn.settimeout(max(0.01, deadline - time.monotonic()))
            conn.sendall(f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
                         f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                         .encode() + body)
        except OSError:  # TimeoutError included: the deadline passed
            return
        finally:
            conn.close()
            self.slots.release()

    def _reply_to(self, request_line: bytes) -> tuple[str, bytes, str]:
        parts = request_line.split()
        if len(parts) != 3 or parts[0] != b"GET":
            return "405 Method Not Allowed", b"only GET /metrics\n", _TEXT
        if parts[1].split(b"?", 1)[0] != b"/metrics":
            return "404 Not Found", b"not found: the collector's metrics are at /metrics\n", _TEXT
        return "200 OK", render(self.telemetry, self.supervisor_pid).encode(), CONTENT_TYPE


def start_self_metrics(sock: socket.socket, telemetry: Telemetry,
                       supervisor_pid: int) -> ScrapeServer:
    """Serve ``GET /metrics`` on the listening socket ``sock`` from a daemon thread."""
    server = ScrapeServer(sock, telemetry, supervisor_pid)
    threading.Thread(target=server.serve_forever, name="self-metrics", daemon=True).start()
    return server
