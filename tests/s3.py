"""An S3 endpoint for tests: moto's server mode on 127.0.0.1, started and stopped by PID.

``moto_server`` speaks the S3 REST API over HTTP, including conditional PUTs (``If-Match``,
``If-None-Match``), which the state files and the job lease rely on. Tests that need it skip
when obstore, s3fs or moto are not installed (the ``[s3]`` extra).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

#: Credentials moto accepts (any); set so no client looks for real ones.
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_REGION": "us-east-1"}


@dataclass
class S3Server:
    """A running moto server: its endpoint and the environment that points clients at it."""

    endpoint: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def env(self) -> dict[str, str]:
        """What a fleetlens process needs to use this server (and only it)."""
        return {**CREDENTIALS, "AWS_ENDPOINT_URL": self.endpoint,
                "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "AWS_CONFIG_FILE": os.devnull}

    def bucket(self, stem: str = "fleet", name: str | None = None) -> str:
        """Create a bucket (a fresh name unless given, so tests never share one)."""
        name = name or f"{stem}-{secrets.token_hex(4)}"
        request = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT")
        with urllib.request.urlopen(request, timeout=10) as reply:
            assert reply.status == 200
        return name


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def moto_server(log_dir: Path, port: int | None = None) -> Iterator[S3Server]:
    """Start ``moto_server -H 127.0.0.1 -p PORT`` (a free port unless given); stop it by its
    PID on exit. Its buckets live in its memory: a restarted server has none."""
    for module in ("obstore", "s3fs", "moto"):
        pytest.importorskip(module, reason="the [s3] extra (obstore, s3fs, moto[server])")
    binary = Path(sys.executable).parent / "moto_server"
    if not binary.exists():
        pytest.skip("moto_server is not installed (pip install 'moto[server]')")
    port = port or _free_port()
    log_path = log_dir / f"moto-{port}.log"
    with open(log_path, "ab") as log:
        process = subprocess.Popen([str(binary), "-H", "127.0.0.1", "-p", str(port)],
                                   stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = S3Server(f"http://127.0.0.1:{port}", process, log_path)
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"moto_server exited: {log_path.read_text()[-2000:]}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            if time.monotonic() > deadline:
                raise TimeoutError("moto_server did not listen within 30 s")
            time.sleep(0.1)
        yield server
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait()


@pytest.fixture(scope="module", name="s3")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A moto S3 server for the module, with this process's environment pointed at it."""
    with moto_server(tmp_path_factory.mktemp("moto")) as server:
        # every AWS_* variable: opening a bucket exports what it resolved (s3config.export)
        saved = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
        os.environ.update(server.env)
        try:
            yield server
        finally:
            for key in [k for k in os.environ if k.startswith("AWS_")]:
                del os.environ[key]
            os.environ.update(saved)
