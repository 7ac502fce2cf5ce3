"""The collector process: workers sharing the ports, self-telemetry, health, SIGTERM drain,
cardinality cap, loopback-only defaults and config errors."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fleetlens.collector.cli import load
from fleetlens.collector.config import LOOPBACK, CollectorConfig
from fleetlens.collector.decode_common import OVERFLOW_NAME
from fleetlens.collector.signals import SPANS
from fleetlens.collector.testing import (
    LOOPBACK_HEX,
    listening_addresses,
    running_collector,
    vllm_trace_request,
)
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.storage import DataDir, parquet_files, scan

pytestmark = pytest.mark.e2e


def _metrics(col) -> dict[str, float]:
    with urllib.request.urlopen(f"{col.http_url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def test_two_workers_share_the_ports_and_drain_on_sigterm(tmp_path) -> None:
    data = tmp_path / "data"
    sent = 0
    with running_collector(data, workers=2, config={"flush_interval_s": 60.0}) as col:
        assert len(_children(col.pid)) >= 2
        # The ports accept once the first worker listens; on loaded cores the second may
        # come seconds later, and connections made before then all go to the first.
        deadline = time.monotonic() + 60
        while col.logs().count("serving OTLP/gRPC") < 2:
            assert time.monotonic() < deadline, "the second worker never served"
            time.sleep(0.05)
        for i in range(24):  # a new connection each time: the kernel spreads them
            channel = grpc.insecure_channel(col.grpc_address,
                                            options=[("grpc.use_local_subchannel_pool", 1)])
            call = channel.unary_unary(SPANS.grpc_method,
                                       request_serializer=lambda m: m.SerializeToString(),
                                       response_deserializer=SPANS.response.FromString)
            call(vllm_trace_request(25, seed=i), timeout=30)
            channel.close()
            sent += 25
        health = health_pb2_grpc.HealthStub(col.channel())
        status = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status
        assert status == health_pb2.HealthCheckResponse.SERVING
        metrics = _metrics(col)
        assert metrics["fleetlens_collector_received_spans_total"] == sent
        assert metrics['fleetlens_collector_export_seconds_bucket{le="+Inf"}'] == 24
        assert metrics["fleetlens_collector_flushed_rows_total"] == 0  # 60 s flush interval
        assert col.stop() == 0  # SIGTERM: drains and publishes what is buffered
    assert scan(DataDir(data), "spans").collect().height == sent
    writers = {p.name.rsplit("-", 1)[0] for p in parquet_files(data / "raw")}
    assert len(writers) == 2
    assert not list((data / "wal").rglob("*.wal"))


def test_cardinality_cap_puts_new_service_names_in_the_overflow_bucket(tmp_path) -> None:
    data = tmp_path / "data"
    with running_collector(data, config={"max_names_per_window": 3}) as col:
        for i in range(10):
            col.export(vllm_trace_request(2, service_name=f"svc-{i}", host_name="h"))
        # host "h" took one of the 3 slots; svc-0 and svc-1 the others
        assert _metrics(col)["fleetlens_collector_overflow_names_total"] == 8
        col.stop()
    names = scan(DataDir(data), "spans").select(c.SERVICE_NAME).collect()
    assert sorted(set(names[c.SERVICE_NAME])) == [OVERFLOW_NAME, "svc-0", "svc-1"]
    assert names.height == 20


def test_defaults_are_loopback_and_listeners_bind_only_loopback(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("FLEETLENS_CONFIG", "FLEETLENS_COLLECTOR__GRPC_ADDRESS",
                 "FLEETLENS_COLLECTOR__HTTP_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    config, _ = load(None, {})
    assert config == CollectorConfig()
    assert config.grpc_address.startswith(f"{LOOPBACK}:")
    assert config.http_address.startswith(f"{LOOPBACK}:")
    with running_collector(tmp_path / "data") as col:
        for address in (col.grpc_address, col.http_address):
            found = listening_addresses(int(address.rpartition(":")[2]))
            assert found and found <= LOOPBACK_HEX, found
        col.stop()


def test_a_bad_config_is_a_clear_error(tmp_path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[collector]\nflush_rowz = 10\n')
    out = subprocess.run([sys.executable, "-m", "fleetlens", "collector", "--config", str(bad),
                          "--data-dir", str(tmp_path / "d")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "collector.flush_rowz: unknown key; did you mean 'flush_rows'?" in out.stderr


@pytest.mark.parametrize("workers", [1, 2])
def test_missing_tls_files_are_a_clear_error(tmp_path, workers) -> None:
    config = tmp_path / "tls.toml"
    config.write_text(f'[collector.tls]\ncert_file = "{tmp_path}/none.crt"\n'
                      f'key_file = "{tmp_path}/none.key"\n')
    out = subprocess.run([sys.executable, "-m", "fleetlens", "collector", "--config", str(config),
                          "--data-dir", str(tmp_path / "d"), "--grpc-address", "127.0.0.1:0",
                          "--http-address", "127.0.0.1:0", "--workers", str(workers)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "cannot read TLS files for OTLP/gRPC" in out.stderr
    if workers == 1:
        assert "Traceback" not in out.stderr
    else:
        assert "a worker failed 3 times right after starting" in out.stderr


def test_stale_temporary_parquet_files_are_removed_at_start(tmp_path) -> None:
    import os
    import time

    data = tmp_path / "data"
    hour = data / "raw" / "spans" / "date=2026-01-01" / "hour=00"
    hour.mkdir(parents=True)
    old, fresh = hour / ".x-1.parquet.ab12.tmp", hour / ".x-2.parquet.cd34.tmp"
    old.write_bytes(b"torn")
    fresh.write_bytes(b"being written")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    with running_collector(data) as col:
        col.stop()
    assert not old.exists() and fresh.exists()
