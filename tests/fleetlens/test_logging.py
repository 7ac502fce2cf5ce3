"""`fleetlens --log-format json --log-level ...`: a real collector with two forked workers logs
one JSON object per line, each worker's lines tagged, at the level asked for."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fleetlens.collector.testing import free_port, wait_for_port


def run_collector(tmp_path: Path, *global_options: str, workers_logging: int = 2) -> list[str]:
    """Start a collector with two workers, wait until ``workers_logging`` of them said they
    are serving, stop it; its output lines."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    grpc_address, http_address = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETLENS_")}
    log = tmp_path / "collector.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fleetlens", *global_options, "collector", "--data-dir",
             str(tmp_path / "data"), "--grpc-address", grpc_address, "--http-address",
             http_address, "--workers", "2"], stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        wait_for_port(grpc_address, 60, proc)
        wait_for_port(http_address, 60, proc)
        deadline = time.monotonic() + 60  # the port opens with the first worker
        while (log.read_text().count("serving OTLP/gRPC") < workers_logging
               and time.monotonic() < deadline):
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    return [line for line in log.read_text().splitlines() if line.strip()]


def test_json_logs_from_the_supervisor_and_every_worker(tmp_path: Path) -> None:
    lines = run_collector(tmp_path, "--log-format", "json", "--log-level", "info")
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    assert all({"ts", "level", "logger", "msg"} <= r.keys() for r in records)
    serving = [r for r in records if "serving OTLP/gRPC" in r["msg"]]
    assert {r.get("process") for r in serving} == {"worker0", "worker1"}
    assert any("supervisor" in r["msg"] for r in records if "process" not in r)


def test_log_level_warning_keeps_the_info_lines_out(tmp_path: Path) -> None:
    lines = run_collector(tmp_path, "--log-level", "warning", workers_logging=0)
    assert not [line for line in lines if " INFO " in line], lines
    plain = run_collector(tmp_path / "again")  # the default: info, as text
    assert any(" worker0 INFO " in line and "serving OTLP/gRPC" in line for line in plain)
