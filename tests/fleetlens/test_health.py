"""`fleetlens health`, the command container HEALTHCHECKs and Kubernetes probes run: it passes
on a live component and fails, with one line, on a dead, wedged or sick one."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fleetlens.collector.testing import running_collector
from tests.s3 import s3_server  # noqa: F401 - the fixture `s3`


def fleetlens(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("FLEETLENS_")}
    environment.update(env or {})
    return subprocess.run([sys.executable, "-m", "fleetlens", *args], capture_output=True,
                          text=True, timeout=120, env=environment)


@contextmanager
def answering(status: int, body: bytes) -> Iterator[str]:
    """A loopback HTTP server answering every GET with ``status`` and ``body``."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_collector_health_follows_the_real_collector(tmp_path: Path) -> None:
    # The ingest token guards Export, not health: a probe has no token.
    with running_collector(tmp_path / "data", config={"auth_tokens": ["s3cret"]}) as col:
        out = fleetlens("health", "collector", "--address", col.grpc_address)
        assert out.returncode == 0, out.stderr
        assert "SERVING" in out.stdout
        address = col.grpc_address
        col.stop()
    out = fleetlens("health", "--timeout", "2", "collector", "--address", address)
    assert out.returncode == 1
    assert "UNAVAILABLE" in out.stderr or "DEADLINE_EXCEEDED" in out.stderr


def test_dashboard_health_needs_ok_from_stcore_health() -> None:
    with answering(200, b"ok") as url:
        out = fleetlens("health", "dashboard", "--url", url)
        assert out.returncode == 0, out.stderr
    with answering(503, b"unavailable") as url:
        out = fleetlens("health", "dashboard", "--url", url)
        assert out.returncode == 1 and "/_stcore/health" in out.stderr


def test_pipeline_health_follows_the_heartbeat_of_a_real_run(tmp_path: Path) -> None:
    data = tmp_path / "data"
    out = fleetlens("health", "pipeline", "--data-dir", str(data))
    assert out.returncode == 1 and "no heartbeat" in out.stderr
    data.mkdir()
    run = fleetlens("pipeline", "--data-dir", str(data), "--no-progress")
    assert run.returncode == 0, run.stderr
    beat = json.loads((data / "state" / "pipeline-heartbeat.json").read_text())
    assert abs(beat["unix_s"] - time.time()) < 600
    out = fleetlens("health", "pipeline", "--data-dir", str(data), "--max-age", "600")
    assert out.returncode == 0, out.stderr
    # a loop that stopped finishing runs fails its probe
    out = fleetlens("health", "pipeline", "--data-dir", str(data), "--max-age", "0")
    assert out.returncode == 1 and "more than 0 s" in out.stderr


def test_without_a_subcommand_it_checks_what_fleetlens_health_names(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    assert fleetlens("pipeline", "--data-dir", str(data), "--no-progress").returncode == 0
    env = {"FLEETLENS_DATA": str(data)}
    out = fleetlens("health", env={**env, "FLEETLENS_HEALTH": "pipeline"})
    assert out.returncode == 0, out.stderr
    out = fleetlens("health", env={**env, "FLEETLENS_HEALTH": "pipeline,colector"})
    assert out.returncode == 2 and "colector" in out.stderr
    assert fleetlens("health", env=env).returncode == 2  # nothing named: a usage error


def test_pipeline_health_on_an_s3_data_dir(s3, tmp_path: Path) -> None:  # noqa: ANN001
    url = f"s3://{s3.bucket()}/fleet"
    env = {**s3.env, "FLEETLENS_WAL_DIR": str(tmp_path / "wal")}
    out = fleetlens("health", "pipeline", "--data-dir", url, env=env)
    assert out.returncode == 1 and "no heartbeat" in out.stderr, out.stderr
    run = fleetlens("pipeline", "--data-dir", url, "--no-progress", env=env)
    assert run.returncode == 0, run.stderr
    out = fleetlens("health", "pipeline", "--data-dir", url, env=env)
    assert out.returncode == 0, out.stderr


def test_a_pipeline_probe_that_fails_says_what_to_run(tmp_path: Path) -> None:
    """Nothing following the data directory (or a loop that stopped): the line names the
    command that writes the heartbeat, with this data directory in it."""
    data = tmp_path / "data"
    data.mkdir()
    follow = f"fleetlens pipeline --follow --data-dir {data}"
    out = fleetlens("health", "pipeline", "--data-dir", str(data))
    assert out.returncode == 1 and follow in out.stderr, out.stderr
    assert "nothing is following" in out.stderr
    assert fleetlens("pipeline", "--data-dir", str(data), "--no-progress").returncode == 0
    out = fleetlens("health", "pipeline", "--data-dir", str(data), "--max-age", "0")
    assert out.returncode == 1 and follow in out.stderr, out.stderr
