"""A small real HTTP gateway for the real-vLLM failure tests (``test_vllm_failures.py``).

It listens on 127.0.0.1 and forwards each HTTP/1.1 request to one upstream vLLM server,
recording it as a real gateway would with the OpenTelemetry SDK: one SERVER span named
``gateway_request`` (:data:`~fleetlens.pipeline.schema.attributes.GATEWAY_SPAN`) with the
HTTP semantic conventions (``http.request.method``, ``url.path``,
``http.response.status_code``, ``error.type`` and status ERROR on a 5xx), where it routed the
request (``server.address``: the engine's host as the fleet names it, the agent's
``host_name``; ``server.port``) and fleetlens' ``fleetlens.instance_id`` of that engine. The
span's W3C ``traceparent`` goes upstream, so vLLM's ``llm_request`` span is its child.

When the upstream refuses the connection or drops it without an answer (a dead server) the
gateway answers 502 Bad Gateway itself; a connect or answer slower than ``--timeout-s``
(default 600 s: a stopped server's requests wait for it) is 504. Either way only the
gateway's failed span is left of the request, which the pipeline turns into one failed
request on the engine named by the span (``source = gateway``).

Each connection carries one request (``Connection: close``, as the tests' load generator
sends). Run as ``python -m tests.agent.gateway --port P --upstream-port Q --server-address
HOST --instance-id ID --otlp-endpoint 127.0.0.1:4317``; :func:`running_gateway` starts it
and stops it by PID (SIGTERM flushes its spans).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from fleetlens.pipeline.schema import attributes as a

#: HTTP semantic conventions the pipeline does not read (the span is a plain server span).
HTTP_METHOD, URL_PATH, SERVER_PORT = "http.request.method", "url.path", "server.port"
REASONS = {502: "Bad Gateway", 504: "Gateway Timeout"}


def _answer(status: int, text: str) -> bytes:
    body = text.encode()
    return (f"HTTP/1.1 {status} {REASONS[status]}\r\nContent-Type: text/plain\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


class Gateway:
    """Forwards requests to ``upstream_port`` and records each as a span (module docstring)."""

    def __init__(self, upstream_port: int, server_address: str, instance_id: str,
                 timeout_s: float) -> None:
        from opentelemetry import trace

        self.upstream_port, self.timeout_s = upstream_port, timeout_s
        self.route = {a.SERVER_ADDRESS: server_address, SERVER_PORT: upstream_port,
                      a.FLEETLENS_INSTANCE_ID: instance_id}
        self.tracer = trace.get_tracer("fleetlens.tests.gateway")

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = dict((k.strip().lower(), v.strip()) for k, v in
                           (line.split(":", 1) for line in lines[1:] if ":" in line))
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            writer.write(await self.forward(method, path, headers, body))
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass  # the client went away: nothing to answer
        finally:
            writer.close()

    async def forward(self, method: str, path: str, headers: dict[str, str],
                      body: bytes) -> bytes:
        """The upstream's answer (or the gateway's own 502/504), under one span."""
        from opentelemetry import propagate
        from opentelemetry.trace import SpanKind, Status, StatusCode

        with self.tracer.start_as_current_span(
                a.GATEWAY_SPAN, context=propagate.extract(headers), kind=SpanKind.SERVER,
                attributes={HTTP_METHOD: method, URL_PATH: path, **self.route},
                record_exception=False, set_status_on_exception=False) as span:
            upstream = {k: v for k, v in headers.items() if k not in ("traceparent", "tracestate",
                                                                     "connection", "host")}
            propagate.inject(upstream)  # this span's traceparent: vLLM's span is its child
            upstream.update({"host": f"127.0.0.1:{self.upstream_port}", "connection": "close"})
            error = None
            try:
                raw = await asyncio.wait_for(self._upstream(method, path, upstream, body),
                                             self.timeout_s)
                status = int(raw.split(b" ", 2)[1]) if raw else 0
                if not raw:  # it took the request and closed without an answer: it died
                    raise ConnectionResetError("the upstream closed without answering")
            except TimeoutError:
                status, error, raw = 504, "timeout", _answer(504, "upstream timed out")
            except (OSError, IndexError, ValueError) as exc:
                status, error = 502, type(exc).__name__
                raw = _answer(502, f"upstream failed: {exc}")
            span.set_attribute(a.HTTP_RESPONSE_STATUS_CODE, status)
            if status >= 500:
                span.set_attribute(a.ERROR_TYPE, error or str(status))
                span.set_status(Status(StatusCode.ERROR))
            return raw

    async def _upstream(self, method: str, path: str, headers: dict[str, str],
                        body: bytes) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        try:
            head = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in headers.items())]
            writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
            await writer.drain()
            return await reader.read()  # Connection: close: the answer ends at EOF
        finally:
            writer.close()


async def serve(args: argparse.Namespace) -> None:
    gateway = Gateway(args.upstream_port, args.server_address, args.instance_id, args.timeout_s)
    server = await asyncio.start_server(gateway.handle, "127.0.0.1", args.port, backlog=1024)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream-port", type=int, required=True)
    parser.add_argument("--server-address", required=True)
    parser.add_argument("--instance-id", required=True)
    parser.add_argument("--otlp-endpoint", required=True)
    parser.add_argument("--service-name", default="gateway")
    parser.add_argument("--timeout-s", type=float, default=600.0)
    args = parser.parse_args(argv)
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": args.service_name}))
    provider.add_span_processor(BatchSpanProcessor(
        OTLPSpanExporter(endpoint=args.otlp_endpoint, insecure=True), schedule_delay_millis=500))
    trace.set_tracer_provider(provider)
    try:
        asyncio.run(serve(args))
    finally:
        provider.shutdown()  # flush the spans of the last requests


@contextlib.contextmanager
def running_gateway(log_path: Path, *, port: int, upstream_port: int, server_address: str,
                    instance_id: str, otlp_endpoint: str,
                    timeout_s: float = 600.0) -> Iterator[subprocess.Popen]:
    """The gateway as its own process (the tests' load generator keeps its one asyncio loop
    to itself), ready to accept; SIGTERMed by PID (then killed) on exit."""
    from tests.agent.incident_run import clean_env
    from tests.agent.vllm_env import REPO, stop_tree

    env = {k: v for k, v in clean_env().items() if not k.startswith("OTEL_")}
    command = [sys.executable, "-m", "tests.agent.gateway", "--port", str(port),
               "--upstream-port", str(upstream_port), "--server-address", server_address,
               "--instance-id", instance_id, "--otlp-endpoint", otlp_endpoint,
               "--timeout-s", str(timeout_s)]
    with open(log_path, "ab") as log:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=log,
                                   stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the gateway exited: {log_path.read_text()[-3000:]}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the gateway did not listen: {log_path.read_text()[-3000:]}")
            time.sleep(0.2)
        yield process
    finally:
        stop_tree(process)


if __name__ == "__main__":
    main()
