"""OTLP/HTTP front ends side by side, for ``bench/ingest.py --http``: the collector's worker
(WAL, Parquet, gRPC listener too) with its HTTP listener swapped for each candidate.

- ``old``: ``http.server`` as it was at commit 391c3f5 (loaded from git, not kept in the tree).
- ``h11``: the collector's server (h11 on asyncio, Exports on a thread pool).
- ``uvicorn``: uvicorn (its h11 protocol, asyncio) with an ASGI app over the same OTLP/HTTP
  semantics (``collector/http_otlp.py``) and the same Export thread pool size.

Each runs as ``python bench/ingest_http.py serve KIND DATA_DIR GRPC HTTP`` until SIGTERM;
clients are separate processes posting on kept-alive connections in closed loops.
"""

from __future__ import annotations

import asyncio
import http.client
import subprocess
import sys
import threading
import time
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OLD_COMMIT = "391c3f5"
KINDS = ("old", "h11", "uvicorn")


def _old_start() -> Any:
    source = subprocess.run(["git", "-C", str(REPO), "show",
                             f"{OLD_COMMIT}:collector/http_server.py"],
                            capture_output=True, text=True, check=True).stdout
    module = types.ModuleType("old_http_server")
    exec(compile(source, "old_http_server.py", "exec"), module.__dict__)  # noqa: S102
    return module.start_http


class _Uvicorn:
    """uvicorn serving the collector's OTLP/HTTP semantics from a background thread."""

    def __init__(self, config: Any, ingest: Any) -> None:
        import uvicorn

        from fleetlens.collector import http_otlp

        self.otlp, self.ingest = http_otlp, ingest
        self.pool = ThreadPoolExecutor(config.http_threads)
        host, _, port = config.http_address.rpartition(":")
        self.server = uvicorn.Server(uvicorn.Config(
            self.app, host=host, port=int(port), http="h11", loop="asyncio", lifespan="off",
            interface="asgi3",
            log_level="warning", access_log=False,
            limit_concurrency=config.http_max_connections,
            timeout_keep_alive=int(config.http_idle_timeout_s)))
        threading.Thread(target=self.server.run, daemon=True).start()
        while not self.server.started:
            time.sleep(0.05)

    async def app(self, scope: dict, receive: Any, send: Any) -> None:
        headers: dict[str, list[str]] = {}
        for name, value in scope["headers"]:
            headers.setdefault(name.decode().lower(), []).append(value.decode("latin-1"))
        todo = self.otlp.plan(self.ingest, scope["method"], scope["path"], headers)
        if isinstance(todo, self.otlp.Reply):
            reply = todo
        else:
            body, more = bytearray(), True
            while more:
                message = await receive()
                body += message.get("body", b"")
                more = message.get("more_body", False)
            reply = await asyncio.get_running_loop().run_in_executor(
                self.pool, self.otlp.export, self.ingest, todo, bytes(body))
        await send({"type": "http.response.start", "status": reply.status, "headers": [
            (b"content-type", reply.content_type.encode()),
            (b"content-length", str(len(reply.body)).encode()),
            *((k.encode(), v.encode()) for k, v in reply.headers)]})
        await send({"type": "http.response.body", "body": reply.body})

    def shutdown(self) -> None:
        self.server.should_exit = True


def serve(kind: str, data_dir: str, grpc_address: str, http_address: str) -> None:
    """Run one collector worker whose HTTP listener is ``kind`` (until SIGTERM)."""
    sys.path.insert(0, str(REPO))
    from fleetlens.collector import worker
    from fleetlens.collector.config import CollectorConfig

    if kind == "old":
        worker.start_http = _old_start()
    elif kind == "uvicorn":
        worker.start_http = _Uvicorn
    config = CollectorConfig(grpc_address=grpc_address, http_address=http_address)
    worker.run_worker(config, data_dir)


def client(address: str, body: bytes, start_at: float, seconds: float, queue: Any) -> None:
    """POST ``body`` on one kept-alive connection in a closed loop; put (answers, errors)."""
    host, _, port = address.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    headers = {"Content-Type": "application/x-protobuf"}
    ok = errors = 0
    while time.time() < start_at:
        time.sleep(0.005)
    while time.time() < start_at + seconds:
        try:
            conn.request("POST", "/v1/traces", body=body, headers=headers)
            response = conn.getresponse()
            response.read()
            if response.status == 200:
                ok += 1
            else:
                errors += 1
        except (OSError, http.client.HTTPException):
            errors += 1
            conn.close()
            conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.close()
    queue.put((ok, errors))


def run_kind(kind: str, spans: int, clients: int, seconds: float) -> dict[str, float]:
    """One measured run of front end ``kind``: requests/s, server CPU per span, stored == acked.

    The server is a fresh process on free loopback ports and an empty data directory.
    """
    import multiprocessing
    import os
    import signal
    import tempfile

    from bench import ingest_procs as proc_stats
    from fleetlens.collector.testing import free_port, vllm_trace_request, wait_for_port
    from fleetlens.pipeline.storage import DataDir, scan

    body = vllm_trace_request(spans, seed=spans).SerializeToString()
    with tempfile.TemporaryDirectory(prefix="fleetlens-http-bench-") as tmp:
        data = Path(tmp) / "data"
        grpc_address, http_address = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETLENS_")}
        server = subprocess.Popen([sys.executable, __file__, "serve", kind, str(data),
                                   grpc_address, http_address], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for_port(http_address, 60, server)
            context = multiprocessing.get_context("spawn")
            queue = context.Queue()
            start_at = time.time() + 3.0
            procs = [context.Process(target=client, args=(http_address, body, start_at,
                                                          seconds, queue))
                     for _ in range(clients)]
            for proc in procs:
                proc.start()
            while time.time() < start_at:
                time.sleep(0.005)
            cpu_before = proc_stats.cpu_seconds(server.pid)
            time.sleep(seconds)
            cpu_used = proc_stats.cpu_seconds(server.pid) - cpu_before
            results = [queue.get(timeout=seconds + 60) for _ in procs]
            for proc in procs:
                proc.join()
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(60)
        stored = scan(DataDir(data), "spans").collect().height
    ok = sum(r[0] for r in results)
    return {"requests_per_s": ok / seconds, "spans_per_s": ok * spans / seconds,
            "cpu_us_per_span": 1e6 * cpu_used / max(ok * spans, 1),
            "cpu_us_per_request": 1e6 * cpu_used / max(ok, 1),
            "errors": float(sum(r[1] for r in results)),
            "stored_equals_acked": float(stored == ok * spans)}


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(*sys.argv[2:6])
