"""OTLP/HTTP receiver: ``POST /v1/{traces,metrics,logs}`` (protobuf or JSON, optional gzip,
Content-Length or chunked), ``GET /metrics`` (Prometheus self-telemetry) and ``GET /health``.

HTTP/1.1 is parsed by h11 (strict framing: digits-only Content-Length, a body that ends early
is an error, chunked bodies) on one asyncio loop per worker, so an idle or trickling
connection costs a socket, not a thread. Measured against ``http.server`` and uvicorn
(``bench/ingest.py --http``, docs/benchmarks.md): uvicorn costs the same CPU within noise but
has no deadline for reading a request; ``http.server`` costs about 20% less CPU per small
request but holds a thread per connection. Bounds, each from the config:

- ``http_max_connections`` open connections; one more is answered 503 + Retry-After, by at
  most an eighth as many refusal slots (a refusal lingers, holding its descriptor); past
  those a connection is closed unanswered. Both shrink when the descriptors are scarce
  (:mod:`~fleetlens.collector.descriptors`).
- ``http_threads`` threads run Exports (decode, WAL fsync); the loop never blocks on them.
- ``http_request_timeout_s`` from a request's first byte to its last: a client sending one
  byte a minute is answered 408 and dropped. ``http_idle_timeout_s`` between requests.
- Out of file descriptors (EMFILE), asyncio stops accepting for a second instead of spinning.
- Bodies are read only up to ``max_request_bytes``; gzip is inflated with the same bound.
- Body bytes held at once (being read or exported) stay within ``http_body_budget_bytes`` per
  worker: the body that would pass it is answered 503 + Retry-After, unread (issue 33: ten
  60 MiB bodies held one byte short took a worker from 84 to 684 MiB).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus
from typing import Any

import h11

from fleetlens.collector.config import CollectorConfig
from fleetlens.collector.errors import Overloaded, TooLarge
from fleetlens.collector.http_body import MAX_HEAD_LINES, TooManyHeaders, check_head_lines
from fleetlens.collector.http_listen import listen, tls_context
from fleetlens.collector.http_otlp import Headers, Plan, Reply, error_reply, export, plan
from fleetlens.collector.ingest import Ingest
from fleetlens.collector.telemetry import log

_CHUNK = 1 << 16
#: Largest request head (request line and headers).
MAX_HEAD_BYTES = 64 * 1024
#: After refusing a request unread, how long its body is drained so the client can read the
#: answer (closing with unread data sends a TCP reset that may destroy the answer).
LINGER_S = 2.0
LINGER_BYTES = 8 << 20
TLS_HANDSHAKE_S = 10.0
#: Seconds between two log lines about accept errors (EMFILE) or handshake failures.
LOG_EVERY_S = 60.0
BUSY = Reply(503, b"too many connections; retry\n", headers=(("Retry-After", "1"),), close=True)
TIMED_OUT = Reply(408, b"request not received in time\n", close=True)
TOO_MANY_HEADERS = Reply(431, f"more than {MAX_HEAD_LINES} header lines\n".encode(), close=True)

HEAD_REFUSED = Reply(405, b"", headers=(("Allow", "GET, POST"),), close=True)


def _headers(event: h11.Request) -> Headers:
    found: Headers = {}
    for name, value in event.headers:
        found.setdefault(name.decode("ascii").lower(), []).append(value.decode("latin-1"))
    return found


def _peer(writer: asyncio.StreamWriter) -> str | None:
    """The client as gRPC names a peer (``ipv4:127.0.0.1:51234``, ``ipv6:[::1]:51234``)."""
    address = writer.get_extra_info("peername")
    if not address:
        return None
    host, port = address[0], address[1]
    return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"


class HttpServer:
    """The OTLP/HTTP listener of one worker, serving from its own thread."""

    def __init__(self, config: CollectorConfig, ingest: Ingest,
                 tls: ssl.SSLContext | None, fd_cap: int | None = None) -> None:
        self.config = config
        self.ingest = ingest
        self.tls = tls
        #: Open connections served, and connections being refused with a 503 at once.
        self.max_open = config.http_max_connections
        self.max_refusing = max(1, self.max_open // 8)
        if fd_cap is not None and fd_cap < self.max_open + self.max_refusing:
            self.max_refusing = max(1, fd_cap // 9)
            self.max_open = max(1, fd_cap - self.max_refusing)
        self.refusing = 0
        #: Body bytes held by requests being read or exported (the loop's thread only).
        self.body_bytes = 0
        self.pool = ThreadPoolExecutor(config.http_threads, thread_name_prefix="http-export")
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(self._loop_error)
        self.open = 0
        #: Exports running on the pool: shutdown waits for these (their clients get answers).
        self.exporting = 0
        self.closing = False
        self._writers: set[asyncio.StreamWriter] = set()
        self._last_log = 0.0
        #: Errors asyncio reported (accept failures, exceptions that escaped a connection).
        self.loop_errors = 0
        self._server: asyncio.base_events.Server | None = None
        self._thread = threading.Thread(target=self.loop.run_forever, name="http", daemon=True)

    def start(self, sock: socket.socket) -> None:
        """Serve connections accepted on the listening ``sock`` (in a background thread)."""
        self._server = self.loop.run_until_complete(asyncio.start_server(
            self._connection, sock=sock, limit=MAX_HEAD_BYTES))
        self._thread.start()

    def shutdown(self, grace_s: float = 10.0) -> None:
        """Stop accepting, let requests being handled finish (up to ``grace_s``), stop."""
        done = asyncio.run_coroutine_threadsafe(self._stop(grace_s), self.loop)
        done.result(grace_s + 5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self.loop.close()
        self.pool.shutdown(wait=False)

    async def _stop(self, grace_s: float) -> None:
        self.closing = True
        if self._server is not None:
            self._server.close()
        deadline = self.loop.time() + grace_s
        while self.exporting and self.loop.time() < deadline:
            await asyncio.sleep(0.05)
        # Idle connections and requests still arriving were never acknowledged: close them
        # (each connection's task then ends by itself; answers already written are flushed).
        for writer in list(self._writers):
            writer.close()
        deadline = self.loop.time() + 2.0
        while self.open and self.loop.time() < deadline:
            await asyncio.sleep(0.05)

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        # asyncio reports EMFILE at accept (it retries a second later by itself) and similar
        # conditions here; once a minute is enough to tell the operator.
        self.loop_errors += 1
        now = time.monotonic()
        if now - self._last_log >= LOG_EVERY_S:
            self._last_log = now
            log.warning("OTLP/HTTP: %s (%s)", context.get("message"), context.get("exception"))

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        if self.open >= self.max_open or self.closing:
            if self.refusing >= self.max_refusing:
                # A refusal holds its descriptor while it lingers: past the refusal slots a
                # flood would take them all (issue 33), so close at once, unanswered.
                self.ingest.telemetry.add("refused_requests")
                writer.transport.abort()
                return
            self.refusing += 1
            try:
                if await self._handshake(writer):
                    await self._refuse(reader, writer)
            finally:
                self.refusing -= 1
                writer.close()
            return
        self.open += 1
        self._writers.add(writer)
        try:
            if await self._handshake(writer):
                await self._serve(reader, writer)
        except (OSError, ssl.SSLError, asyncio.IncompleteReadError):
            pass  # the client went away; nothing was acknowledged on this request
        finally:
            self.open -= 1
            self._writers.discard(writer)
            writer.close()

    async def _handshake(self, writer: asyncio.StreamWriter) -> bool:
        """With TLS on, the handshake, made here so that it counts against the connection caps
        like the connection it opens (made by asyncio before the callback, handshakes in
        progress held descriptors that nothing counted: issue 33). False when it failed."""
        if self.tls is None:
            return True
        try:
            await writer.start_tls(self.tls, ssl_handshake_timeout=TLS_HANDSHAKE_S)
        except (OSError, ssl.SSLError) as exc:  # TimeoutError included
            self._loop_error(self.loop, {"message": "TLS handshake failed", "exception": exc})
            return False
        return True

    async def _refuse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Answer 503 + Retry-After before any request is read, then close (lingering, so
        a client still sending its request can read the answer)."""
        self.ingest.telemetry.add("refused_requests")
        try:
            # h11 answers only after a request; these raw bytes are the same 503
            writer.write(b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\n"
                         b"Connection: close\r\nContent-Type: text/plain\r\n"
                         + f"Content-Length: {len(BUSY.body)}\r\n\r\n".encode() + BUSY.body)
            async with asyncio.timeout(TLS_HANDSHAKE_S):
                await writer.drain()
            await self._linger(reader, writer)
        except OSError:  # TimeoutError included: the client is gone or not reading
            pass
        finally:
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        while not self.closing:
            if not await self._wait_first(conn, reader):
                return  # the client is done, or idled past http_idle_timeout_s
            reply = await self._request(conn, reader, writer)
            if not await self._send(conn, writer, reply):
                return
            if reply.close or conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                await self._linger(reader, writer)
                return
            conn.start_next_cycle()

    async def _wait_first(self, conn: h11.Connection, reader: asyncio.StreamReader) -> bool:
        """Wait (``http_idle_timeout_s``) for the next request's first bytes; False when the
        client closed or stayed idle. Parsing is left to :meth:`_request`."""
        if conn.trailing_data[0]:
            return True  # pipelined: already here
        try:
            async with asyncio.timeout(self.config.http_idle_timeout_s):
                data = await reader.read(_CHUNK)
        except TimeoutError:
            return False
        if not data:
            return False
        conn.receive_data(data)
        return True

    @staticmethod
    async def _next(conn: h11.Connection, reader: asyncio.StreamReader) -> Any:
        """The next h11 event, reading as needed (the caller bounds the time)."""
        while True:
            if conn.their_state is h11.IDLE:  # a head not parsed yet: count its lines first
                check_head_lines(conn.trailing_data[0])
            event = conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            conn.receive_data(await reader.read(_CHUNK))

    async def _request(self, conn: h11.Connection, reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter) -> Reply:
        """Read one whole request within the deadline (from its first byte, already in)
        and produce its reply."""
        held = [0]  # this request's share of body_bytes, given back when it is answered
        try:
            return await self._read_and_export(conn, reader, writer, held)
        finally:
            self.body_bytes -= held[0]

    async def _read_and_export(self, conn: h11.Connection, reader: asyncio.StreamReader,
                               writer: asyncio.StreamWriter, held: list[int]) -> Reply:
        todo: Plan | Reply | None = None
        try:
            # One deadline for the whole request, head and body: a trickle cannot extend it.
            async with asyncio.timeout(self.config.http_request_timeout_s):
                event = await self._next(conn, reader)
                if not isinstance(event, h11.Request):
                    return Reply(400, b"expected a request\n", close=True)
                if event.method == b"HEAD":  # an answer to HEAD has no body: refuse bare
                    return HEAD_REFUSED
                todo = plan(self.ingest, event.method.decode("ascii").upper(),
                            event.target.decode("ascii", "replace"), _headers(event))
                if isinstance(todo, Reply):
                    if not todo.close:  # a GET: its (empty) body ends the request
                        await self._body(conn, reader, held)
                    return todo
                if conn.they_are_waiting_for_100_continue:
                    writer.write(conn.send(h11.InformationalResponse(status_code=100)))
                body = await self._body(conn, reader, held)
        except TimeoutError:
            self.ingest.telemetry.add("invalid_requests")
            return TIMED_OUT
        except TooManyHeaders:
            self.ingest.telemetry.add("invalid_requests")
            return TOO_MANY_HEADERS
        except h11.RemoteProtocolError as exc:
            self.ingest.telemetry.add("invalid_requests")
            return Reply(exc.error_status_hint, f"bad HTTP request: {exc}\n".encode(),
                         close=True)
        except (TooLarge, Overloaded) as error:
            if isinstance(error, Overloaded):
                self.ingest.telemetry.add("refused_requests")
            return error_reply(error, isinstance(todo, Plan) and todo.as_json)
        self.exporting += 1
        try:
            return await self.loop.run_in_executor(self.pool, export, self.ingest, todo, body,
                                                   _peer(writer))
        finally:
            self.exporting -= 1

    async def _body(self, conn: h11.Connection, reader: asyncio.StreamReader,
                    held: list[int]) -> bytes:
        body = bytearray()
        while True:
            event = await self._next(conn, reader)
            if isinstance(event, h11.EndOfMessage):
                return bytes(body)
            if isinstance(event, h11.Data):
                self._hold(held, len(event.data))
                body += event.data
                self.ingest.check_size(len(body))  # chunked bodies have no declared length

    def _hold(self, held: list[int], size: int) -> None:
        """Count ``size`` more body bytes against the worker's budget, or refuse (retryable).

        ``bytes(body)`` copies the body once more at its end: the budget counts it once,
        so the memory it bounds is about twice the budget at worst.
        """
        if self.body_bytes + size > self.config.http_body_budget_bytes:
            raise Overloaded(f"this worker holds {self.body_bytes} bytes of request bodies "
                             f"(http_body_budget_bytes = {self.config.http_body_budget_bytes}); "
                             "retry later")
        self.body_bytes += size
        held[0] += size

    async def _send(self, conn: h11.Connection, writer: asyncio.StreamWriter,
                    reply: Reply) -> bool:
        """Write ``reply``; False when the client is gone or too slow to take it."""
        if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return False
        headers = [("Content-Type", reply.content_type),
                   ("Content-Length", str(len(reply.body))), *reply.headers]
        if reply.close:
            headers.append(("Connection", "close"))
        try:
            data = conn.send(h11.Response(status_code=reply.status, headers=headers,
                                          reason=HTTPStatus(reply.status).phrase))
            data += conn.send(h11.Data(data=reply.body)) + conn.send(h11.EndOfMessage())
            writer.write(data)
            if writer.transport.get_write_buffer_size():  # the client is slow to read
                async with asyncio.timeout(self.config.http_request_timeout_s):
                    await writer.drain()
        except (TimeoutError, h11.LocalProtocolError, OSError):
            return False
        return True

    async def _linger(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Half-close, then drain what the client still sends (bounded) before closing."""
        if not writer.can_write_eof():
            return  # TLS cannot half-close
        try:
            writer.write_eof()
            drained = 0
            async with asyncio.timeout(LINGER_S):
                while drained < LINGER_BYTES and (data := await reader.read(_CHUNK)):
                    drained += len(data)
        except OSError:  # TimeoutError included
            return


def start_http(config: CollectorConfig, ingest: Ingest, fd_cap: int | None = None) -> HttpServer:
    """Start the OTLP/HTTP server on ``config.http_address`` in a background thread.

    ``fd_cap``: descriptors its connections (refusals included) may hold at most.
    """
    tls = tls_context(config)
    try:
        sock = listen(config.http_address)
    except OSError as exc:
        raise RuntimeError(f"cannot listen for OTLP/HTTP on {config.http_address}: {exc}") from None
    server = HttpServer(config, ingest, tls, fd_cap)
    server.start(sock)
    return server
