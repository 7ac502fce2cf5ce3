"""Refusals against the real server: oversize, gzip bombs, garbage, overload, disk full, auth.

Each case checks the exact wire code (gRPC and HTTP), the RetryInfo/Retry-After rule
(retryable codes carry it, permanent ones never) and that the server keeps serving.
"""

from __future__ import annotations

import gzip
import time
import urllib.error
import urllib.request

import grpc
import pytest
from google.rpc.error_details_pb2 import RetryInfo

from fleetlens.collector.errors import RETRY_INFO_KEY
from fleetlens.collector.signals import SPANS
from fleetlens.collector.testing import (
    running_collector,
    trace_request,
    vllm_span,
    vllm_trace_request,
)
from fleetlens.collector.wal import FAULT_DISK_FULL_ENV
from fleetlens.pipeline.storage import DataDir, scan

pytestmark = pytest.mark.e2e
PROTOBUF = {"Content-Type": "application/x-protobuf"}


def _post(col, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(f"{col.http_url}{SPANS.http_path}", data=body,
                                 headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        with err:
            return err.code, dict(err.headers), err.read()


def _grpc_error(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def _retry_delay(error: grpc.RpcError) -> float | None:
    raw = dict(error.trailing_metadata() or ()).get(RETRY_INFO_KEY)
    if raw is None:
        return None
    delay = RetryInfo.FromString(raw).retry_delay
    return delay.seconds + delay.nanos / 1e9


def _spans(data_dir) -> int:
    return scan(DataDir(data_dir), "spans").collect().height


def test_oversize_garbage_and_gzip_bombs_are_permanent_refusals(tmp_path) -> None:
    limit = 256 * 1024
    with running_collector(tmp_path / "data", config={"max_request_bytes": limit}) as col:
        big = trace_request([vllm_span()])
        big.resource_spans[0].scope_spans[0].spans[0].name = "x" * (2 * limit)
        error = _grpc_error(lambda: col.export(big))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert _retry_delay(error) is None
        # gRPC gzip bomb: 8 MiB of one byte compresses to a few KiB, inflates past the limit.
        bomb = trace_request([vllm_span()])
        bomb.resource_spans[0].scope_spans[0].spans[0].name = "\0" * (8 * 1024 * 1024)
        call = col.channel().unary_unary(SPANS.grpc_method,
                                         request_serializer=lambda m: m.SerializeToString(),
                                         response_deserializer=SPANS.response.FromString)
        error = _grpc_error(lambda: call(bomb, timeout=30, compression=grpc.Compression.Gzip))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert _retry_delay(error) is None
        # Garbage is INVALID_ARGUMENT, never INTERNAL.
        error = _grpc_error(lambda: col.export_bytes(SPANS, b"\xff\x00garbage" * 10))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        # OTLP/HTTP: oversize body, gzip bomb (1 GiB of zeros -> about 1 MiB), garbage.
        status, headers, _ = _post(col, b"\0" * (limit + 1), PROTOBUF)
        assert status == 413 and "Retry-After" not in headers
        zeros = gzip.compress(b"\0" * (256 * 1024 * 1024), compresslevel=9)
        status, headers, _ = _post(col, zeros, {**PROTOBUF, "Content-Encoding": "gzip"})
        assert status == 413 and "Retry-After" not in headers
        assert _post(col, b"\xff\xfe\xfd", PROTOBUF)[0] == 400
        assert _post(col, b"{not json", {"Content-Type": "application/json"})[0] == 400
        assert _post(col, b"x", {"Content-Type": "text/plain"})[0] == 415
        # Still serving, and what was good is stored.
        gz = gzip.compress(vllm_trace_request(7).SerializeToString())
        assert _post(col, gz, {**PROTOBUF, "Content-Encoding": "gzip"})[0] == 200
        col.export(vllm_trace_request(5))
        col.stop()
    assert _spans(tmp_path / "data") == 12


def test_overload_answers_unavailable_with_retry_info_and_a_retrying_client_loses_nothing(
        tmp_path) -> None:
    config = {"max_buffered_bytes": 150_000, "flush_interval_s": 0.5, "flush_rows": 10**6}
    requests = [vllm_trace_request(128, seed=i) for i in range(15)]
    with running_collector(tmp_path / "data", config=config) as col:
        acked, refusals, delays = 0, 0, set()
        deadline = time.monotonic() + 60
        sent = 0
        while sent < len(requests) and time.monotonic() < deadline:
            try:
                col.export(requests[sent])
                acked += 128
                sent += 1
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.UNAVAILABLE
                delays.add(_retry_delay(error))
                refusals += 1
                time.sleep(0.1)
        assert sent == len(requests) and refusals > 0 and None not in delays
        # HTTP gets 503 + Retry-After under the same pressure.
        statuses = set()
        for request in requests:
            status, headers, _ = _post(col, request.SerializeToString(), PROTOBUF)
            statuses.add(status)
            if status == 503:
                assert int(headers["Retry-After"]) >= 1
                break
            acked += 128
        assert 503 in statuses
        col.stop()
    assert _spans(tmp_path / "data") == acked


def test_disk_full_is_unavailable_never_ok_and_recovers(tmp_path) -> None:
    flag = tmp_path / "disk-full"
    with running_collector(tmp_path / "data", env={FAULT_DISK_FULL_ENV: str(flag)}) as col:
        col.export(vllm_trace_request(10, seed=1))
        flag.touch()
        for seed in range(2, 5):
            error = _grpc_error(lambda s=seed: col.export(vllm_trace_request(10, seed=s)))
            assert error.code() == grpc.StatusCode.UNAVAILABLE and _retry_delay(error)
        status, headers, _ = _post(col, vllm_trace_request(3).SerializeToString(), PROTOBUF)
        assert status == 503 and "Retry-After" in headers
        flag.unlink()
        col.export(vllm_trace_request(10, seed=9))
        col.stop()
    assert _spans(tmp_path / "data") == 20


def test_bearer_tokens(tmp_path) -> None:
    data = tmp_path / "data"
    secret, wrong = "s3cret-token-abc", "wrong-token-xyz"
    with running_collector(data, config={"auth_tokens": [secret]}) as col:
        request = vllm_trace_request(4)
        for metadata in ((), (("authorization", f"Bearer {wrong}"),),
                         (("authorization", secret),)):
            error = _grpc_error(lambda m=metadata: col.export(request, metadata=m))
            assert error.code() == grpc.StatusCode.UNAUTHENTICATED
        body = request.SerializeToString()
        assert _post(col, body, PROTOBUF)[0] == 401
        assert _post(col, body, {**PROTOBUF, "Authorization": f"Bearer {wrong}"})[0] == 401
        assert not list((data / "wal").rglob("*.wal")) or all(
            p.stat().st_size == 0 for p in (data / "wal").rglob("*.wal"))
        col.export(request)  # the fixture sends the configured token
        assert _post(col, body, {**PROTOBUF, "Authorization": f"Bearer {secret}"})[0] == 200
        col.stop()
        log = col.logs()
    assert _spans(data) == 8
    assert secret not in log and wrong not in log
