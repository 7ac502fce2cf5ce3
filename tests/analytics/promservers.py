"""Real Prometheus and Alertmanager servers for tests (Debian's ``prometheus`` 2.42 and
``prometheus-alertmanager`` 0.25; .ci/run installs them): started on 127.0.0.1 on free ports,
each in its own temporary folder, and stopped by PID. A test that needs a binary that is not
installed is skipped with the reason, so a fresh clone without them still passes.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fleetlens.collector.testing import free_port

#: binary -> Debian package
PACKAGES = {"prometheus": "prometheus", "promtool": "prometheus",
            "prometheus-alertmanager": "prometheus-alertmanager",
            "amtool": "prometheus-alertmanager"}
#: how long a server may take to answer, or a query to return data (not asserted: a bound)
PATIENCE_S = 120.0


def binary(name: str) -> str:
    """The path of ``name``, or skip the test naming the package that provides it."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (Debian package {PACKAGES[name]}; "
                    f".ci/run installs it)")
    return path


@dataclass
class Server:
    """A started server: its base URL and process."""

    url: str
    proc: subprocess.Popen
    log: Path

    def get(self, path: str, **params: str) -> Any:
        """``GET path?params`` as JSON."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=30) as resp:
            return json.loads(resp.read())

    def query(self, expr: str) -> list[dict]:
        """An instant PromQL query's result vector (raises on an error answer)."""
        answer = self.get("/api/v1/query", query=expr)
        assert answer["status"] == "success", answer
        return answer["data"]["result"]


def wait_for(check: Callable[[], Any], what: str, server: Server | None = None) -> Any:
    """Poll ``check`` until it returns something truthy; fail after :data:`PATIENCE_S`
    with ``what`` and the server's log."""
    deadline = time.monotonic() + PATIENCE_S
    while True:
        try:
            got = check()
        except OSError:
            got = None
        if got:
            return got
        if time.monotonic() > deadline:
            log = server.log.read_text()[-3000:] if server else ""
            raise AssertionError(f"gave up waiting for {what}\n{log}")
        time.sleep(0.5)


@contextmanager
def _run(args: list[str], folder: Path, port: int, ready: str) -> Iterator[Server]:
    log = folder / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=folder)
    server = Server(f"http://127.0.0.1:{port}", proc, log)
    try:
        def ready_now() -> bool:
            assert proc.poll() is None, f"{args[0]} exited: {log.read_text()[-3000:]}"
            return urllib.request.urlopen(f"{server.url}{ready}", timeout=5).status == 200

        wait_for(ready_now, f"{args[0]} to be ready", server)
        yield server
    finally:
        proc.terminate()  # this process, by its PID; the servers start no children
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


@contextmanager
def prometheus(folder: Path, config: dict[str, Any]) -> Iterator[Server]:
    """A Prometheus with ``config`` (prometheus.yml as a dict) and its own TSDB in
    ``folder``; its web and API on 127.0.0.1 only."""
    exe = binary("prometheus")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    port = free_port()
    with _run([exe, f"--config.file={folder / 'prometheus.yml'}",
               f"--storage.tsdb.path={folder / 'tsdb'}",
               f"--web.listen-address=127.0.0.1:{port}"], folder, port, "/-/ready") as server:
        yield server


@contextmanager
def alertmanager(folder: Path, config: dict[str, Any]) -> Iterator[Server]:
    """An Alertmanager with ``config`` (alertmanager.yml as a dict), clustering off (its
    default gossips on 0.0.0.0:9094), on 127.0.0.1."""
    exe = binary("prometheus-alertmanager")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "alertmanager.yml").write_text(json.dumps(config))
    port = free_port()
    with _run([exe, f"--config.file={folder / 'alertmanager.yml'}",
               f"--storage.path={folder / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
               "--cluster.listen-address="], folder, port, "/-/ready") as server:
        yield server


__all__ = ["Server", "alertmanager", "binary", "prometheus", "wait_for"]
