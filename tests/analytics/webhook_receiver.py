"""A real HTTP receiver on 127.0.0.1 for webhook tests, and a synthetic fleet to alert on.

The receiver records every request (method, path, headers, body) and answers as a test
sets it: a status, a redirect, or a response dribbled one byte at a time.
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.storage import DataDir
from tests.analytics.synthetic import FleetSpec, Injected, SynthData, generate
from tests.analytics.synthetic_io import write_tables

H = 3600
NS = 1_000_000_000
SPEC = FleetSpec(hosts=3, gpus_per_host=2, duration_s=3 * H, seed=5)
INJECTED = Injected("kv_cache_pressure", "host_name=h01", 2 * H, 900)


@dataclass
class Request:
    """One request as received."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Receiver:
    """Settings and records of one receiver (see :func:`serve`)."""

    port: int = 0
    status: int = 200
    location: str | None = None
    #: Only requests to this path get ``status`` and ``location`` (others: 200).
    redirect_from: str | None = None
    #: Seconds between bytes of a dribbled answer (``None``: answer at once).
    dribble_s: float | None = None
    #: Called while a request is being handled (e.g. to look at the job lock meanwhile).
    during: Callable[[], Any] | None = None
    received: list[Request] = field(default_factory=list)
    during_results: list[Any] = field(default_factory=list)
    hung_up: bool = False
    #: Set when a dribbled answer ended (all sent, or the client hung up).
    dribbled: threading.Event = field(default_factory=threading.Event)

    def url(self, path: str = "/hook", host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def posts(self) -> list[Request]:
        return [r for r in self.received if r.method == "POST"]


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    receiver: Receiver

    def _handle(self) -> None:
        rec = self.server.receiver  # type: ignore[attr-defined]
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        rec.received.append(Request(self.command, self.path, dict(self.headers), body))
        if rec.during is not None:
            rec.during_results.append(rec.during())
        if rec.dribble_s is not None:
            answer = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nX-Pad: " + b"x" * 20 + b"\r\n\r\n"
            try:
                for i in range(len(answer)):
                    self.wfile.write(answer[i:i + 1])
                    self.wfile.flush()
                    time.sleep(rec.dribble_s)
            except OSError:
                rec.hung_up = True
            rec.dribbled.set()
            self.close_connection = True
            return
        redirect = rec.redirect_from is None or self.path == rec.redirect_from
        self.send_response(rec.status if redirect else 200)
        if rec.location and redirect:
            self.send_header("Location", rec.location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_POST = do_GET = _handle  # noqa: N815 - http.server API

    def log_message(self, *args: Any) -> None:
        pass


class serve:  # noqa: N801 - used as a context manager like open()
    """``with serve() as rec:`` a receiver on 127.0.0.1, stopped afterwards."""

    def __init__(self, **settings: Any) -> None:
        self.receiver = Receiver(**settings)
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.daemon_threads = True
        self.server.receiver = self.receiver  # type: ignore[attr-defined]
        self.receiver.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self.receiver

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def fleet() -> SynthData:
    """Three hosts for three hours; h01's KV cache fills from 2:00 to 2:15."""
    return generate(SPEC, [INJECTED])


def until(data: SynthData, seconds: float) -> SynthData:
    """``data`` as the pipeline had it ``seconds`` after the start (the rest not yet seen)."""
    cut = SPEC.start_ns + int(seconds * NS)
    return dataclasses.replace(
        data,
        requests=data.requests.filter(data.requests[c.ARRIVAL_NS] < cut),
        windows=data.windows.filter(data.windows[c.WINDOW_START_NS] < cut),
        engine_samples=data.engine_samples.filter(data.engine_samples[c.TS_NS] < cut),
        gpu_samples=data.gpu_samples.filter(data.gpu_samples[c.TS_NS] < cut),
    )


def data_dir(folder: Path, data: SynthData) -> DataDir:
    """A data directory holding ``data`` as the pipeline would have written it."""
    root = DataDir(folder / "data")
    write_tables(data, root)
    return root


def config_file(folder: Path, text: str) -> Path:
    """A fleetlens.toml with ``text`` as its [analytics] table."""
    path = folder / "fleetlens.toml"
    path.write_text(f"[analytics]\n{text}\n")
    return path
