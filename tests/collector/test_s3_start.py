"""A collector on an ``s3://`` data dir: where its WAL lives (``--wal-dir`` / ``wal_dir``) and
what its start costs the bucket. Real collector processes against moto's S3 server on
127.0.0.1 (``tests/s3.py``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as svc

from fleetlens.collector.testing import free_port, vllm_trace_request, wait_for_port
from fleetlens.collector.worker import remove_stale_tmp
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import TMP_SUFFIX, DataDir, scan
from tests.s3 import S3Server, s3_server  # noqa: F401 - the fixture `s3`

pytestmark = pytest.mark.e2e


@contextmanager
def _collector(url: str, tmp_path: Path, name: str, *, args: tuple[str, ...] = (),
               toml: str = "", env: dict[str, str]) -> Iterator[tuple[subprocess.Popen, str]]:
    """``fleetlens collector --data-dir URL`` run in ``tmp_path`` (where a default WAL folder
    would appear); yields (process, gRPC address) once it serves; kills it by PID at exit."""
    address = f"127.0.0.1:{free_port()}"
    config = tmp_path / f"{name}.toml"
    # long flush interval: accepted rows stay in the WAL until the collector stops
    config.write_text('[collector]\nself_metrics_address = ""\nflush_interval_s = 300.0\n'
                      + toml)
    log = tmp_path / f"{name}.log"
    with open(log, "ab") as handle:
        process = subprocess.Popen(
            [sys.executable, "-m", "fleetlens", "collector", "--data-dir", url,
             "--config", str(config), "--grpc-address", address,
             "--http-address", f"127.0.0.1:{free_port()}", "--workers", "1", *args],
            stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=tmp_path,
            start_new_session=True)
    try:
        wait_for_port(address, 60, process)
        yield process, address
    except BaseException:
        sys.stderr.write(log.read_text()[-3000:])
        raise
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(30)


def _env(s3: S3Server, **extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("FLEETLENS_")}
    return {**base, **s3.env, **extra}


def _wal_files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*.wal") if p.stat().st_size]


def test_wal_dir_option_and_config_place_the_wal(s3: S3Server, tmp_path: Path) -> None:
    """--wal-dir puts the WAL there (over $FLEETLENS_WAL_DIR, and not in ./fleetlens-wal);
    a collector killed with rows only in that WAL leaves them to one started with
    ``wal_dir`` in its config file, which replays them into the bucket."""
    url = f"s3://{s3.bucket()}/fleet"
    chosen, ignored = tmp_path / "wal-chosen", tmp_path / "wal-env"
    env = _env(s3, FLEETLENS_WAL_DIR=str(ignored))
    with _collector(url, tmp_path, "first", args=("--wal-dir", str(chosen)), env=env) as (
            process, address):
        with grpc.insecure_channel(address) as channel:
            svc.TraceServiceStub(channel).Export(vllm_trace_request(25, seed=1), timeout=30)
        assert _wal_files(chosen)  # acknowledged: fsynced in the chosen folder
        assert not ignored.exists() and not (tmp_path / "fleetlens-wal").exists()
        os.kill(process.pid, signal.SIGKILL)  # nothing published yet
        process.wait(30)
    assert not list(DataDir(url).root.rglob("*.parquet"))
    toml = f"wal_dir = {str(chosen)!r}\n"
    with _collector(url, tmp_path, "second", toml=toml, env=_env(s3)) as (process, _):
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
    assert scan(DataDir(url), t.SPANS).collect().height == 25  # replayed from the WAL
    assert not _wal_files(chosen)
    assert not (tmp_path / "fleetlens-wal").exists()


def test_wal_dir_must_be_local(s3: S3Server, tmp_path: Path) -> None:
    """An s3:// WAL folder is a configuration error named at start, not a crash later."""
    out = subprocess.run(
        [sys.executable, "-m", "fleetlens", "collector", "--data-dir",
         f"s3://{s3.bucket()}/fleet", "--wal-dir", "s3://elsewhere/wal"],
        capture_output=True, text=True, timeout=120, env=_env(s3), cwd=tmp_path)
    assert out.returncode != 0
    assert "wal_dir" in out.stderr and "local folder" in out.stderr


def test_collector_start_does_not_list_the_bucket(s3: S3Server, tmp_path: Path) -> None:
    """Start-up looked for stale temporary Parquet files under raw/: on S3 a LIST of every
    object (1,200 here: two pages) that could find none. Now the start sends no request."""
    url = f"s3://{s3.bucket()}/fleet"
    root = DataDir(url).root
    names = [f"raw/spans/date=2026-01-01/hour=00/w-{i}.parquet" for i in range(1200)]
    names.append(f"raw/spans/date=2026-01-01/hour=00/.w-x{TMP_SUFFIX}")  # like a tmp name
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: (root / n).write_bytes(b"x"), names))
    before = root.bucket.requests
    assert remove_stale_tmp(DataDir(url), older_than_s=0) == 0
    assert root.bucket.requests == before  # counted by the Bucket client: none sent
    bucket_path = f"/{root.bucket.name}"
    mark = len(s3.log_path.read_bytes())
    with _collector(url, tmp_path, "start", env=_env(s3, FLEETLENS_WAL_DIR=str(tmp_path / "w"))
                    ) as (process, _):
        time.sleep(0.5)  # the moto server writes its log line after answering
        started = s3.log_path.read_bytes()[mark:].decode()
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
    requests = [line for line in started.splitlines() if bucket_path in line]
    assert requests == [], requests
