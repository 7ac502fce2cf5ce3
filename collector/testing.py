"""Test helpers for anyone who needs a collector: OTLP request builders and a real collector
process on free loopback ports.

    from fleetlens.collector.testing import running_collector, vllm_trace_request

    with running_collector(tmp_path / "data") as col:
        col.export(vllm_trace_request(100))
        col.stop()  # SIGTERM: drains and publishes Parquet
    # tmp_path / "data" / "raw" / "spans" / ... now holds 100 spans

Builders return protobuf messages; ``col.export`` sends them over gRPC and returns the
response. The process is always stopped by PID when the block exits, also on failure.
"""

from __future__ import annotations

import contextlib
import os
import random
import resource as rlimit
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.logs.v1 import logs_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.resource.v1 import resource_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from fleetlens.collector.signals import LOGS, METRICS, SPANS, Signal
from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema.settings import to_toml

SERVER = trace_pb2.Span.SPAN_KIND_SERVER


def any_value(value: Any) -> common_pb2.AnyValue:
    """A Python value as an OTLP AnyValue (str, bool, int, float, bytes, list, dict)."""
    if isinstance(value, bool):
        return common_pb2.AnyValue(bool_value=value)
    if isinstance(value, int):
        return common_pb2.AnyValue(int_value=value)
    if isinstance(value, float):
        return common_pb2.AnyValue(double_value=value)
    if isinstance(value, str):
        return common_pb2.AnyValue(string_value=value)
    if isinstance(value, bytes):
        return common_pb2.AnyValue(bytes_value=value)
    if isinstance(value, list | tuple):
        return common_pb2.AnyValue(array_value=common_pb2.ArrayValue(
            values=[any_value(v) for v in value]))
    if isinstance(value, Mapping):
        return common_pb2.AnyValue(kvlist_value=common_pb2.KeyValueList(values=kvs(value)))
    raise TypeError(f"cannot encode {type(value).__name__} as an AnyValue")


def kvs(attributes: Mapping[str, Any]) -> list[common_pb2.KeyValue]:
    """A dict as an OTLP KeyValue list."""
    return [common_pb2.KeyValue(key=k, value=any_value(v)) for k, v in attributes.items()]


def resource(service_name: str = "vllm", host_name: str = "gpu-01",
             **extra: Any) -> resource_pb2.Resource:
    """A resource with ``service.name``, ``host.name`` and any extra attributes."""
    attrs = {a.SERVICE_NAME: service_name, a.HOST_NAME: host_name, **extra}
    return resource_pb2.Resource(attributes=kvs(attrs))


def vllm_attributes(rng: random.Random, request_id: str) -> dict[str, Any]:
    """The 15 attributes of a vLLM V1 ``llm_request`` span, with plausible values."""
    queue, prefill = rng.uniform(0, 0.2), rng.uniform(0.01, 0.3)
    decode = rng.uniform(0.1, 3.0)
    prompt, completion = rng.randint(16, 4096), rng.randint(1, 1024)
    return {
        a.GEN_AI_REQUEST_ID: request_id, a.GEN_AI_REQUEST_MODEL: "llama-3-8b",
        a.GEN_AI_TIME_IN_QUEUE: queue, a.GEN_AI_TTFT: queue + prefill,
        a.GEN_AI_E2E: queue + prefill + decode, a.GEN_AI_PREFILL: prefill,
        a.GEN_AI_DECODE: decode, a.GEN_AI_INFERENCE: prefill + decode,
        a.GEN_AI_PROMPT_TOKENS: prompt, a.GEN_AI_COMPLETION_TOKENS: completion,
        a.GEN_AI_MAX_TOKENS: 1024, a.GEN_AI_N: 1, a.GEN_AI_TEMPERATURE: 0.7,
        a.GEN_AI_TOP_P: 0.95, a.GEN_AI_FINISH_REASONS: '["stop"]',
    }


def vllm_span(rng: random.Random | None = None, *, start_ns: int | None = None,
              trace_id: bytes | None = None, span_id: bytes | None = None) -> trace_pb2.Span:
    """One vLLM-style ``llm_request`` server span (random ids, 15 gen_ai.* attributes)."""
    rng = rng or random.Random()
    trace_id = trace_id or rng.randbytes(16)
    span_id = span_id or rng.randbytes(8)
    attrs = vllm_attributes(rng, f"cmpl-{trace_id.hex()[:16]}-0")
    start = start_ns if start_ns is not None else time.time_ns() - 5_000_000_000
    end = start + int(attrs[a.GEN_AI_E2E] * 1e9)
    return trace_pb2.Span(
        trace_id=trace_id, span_id=span_id, name=a.VLLM_REQUEST_SPAN, kind=SERVER,
        start_time_unix_nano=start, end_time_unix_nano=end, attributes=kvs(attrs),
    )


def trace_request(spans: list[trace_pb2.Span], *, service_name: str = "vllm",
                  host_name: str = "gpu-01", scope_name: str = "vllm.tracing",
                  **resource_attrs: Any) -> Any:
    """An ExportTraceServiceRequest holding ``spans`` under one resource and scope."""
    return SPANS.request(resource_spans=[trace_pb2.ResourceSpans(
        resource=resource(service_name, host_name, **resource_attrs),
        scope_spans=[trace_pb2.ScopeSpans(
            scope=common_pb2.InstrumentationScope(name=scope_name), spans=spans)],
    )])


def vllm_trace_request(count: int, *, seed: int | None = None, start_ns: int | None = None,
                       **kwargs: Any) -> Any:
    """An ExportTraceServiceRequest of ``count`` vLLM-style spans."""
    rng = random.Random(seed)
    return trace_request([vllm_span(rng, start_ns=start_ns) for _ in range(count)], **kwargs)


def gauge_request(name: str, points: list[tuple[int, float, dict[str, Any]]], *,
                  unit: str = "", service_name: str = "fleetlens-agent",
                  host_name: str = "gpu-01") -> Any:
    """An ExportMetricsServiceRequest with one gauge of ``(ts_ns, value, attributes)`` points."""
    data_points = [metrics_pb2.NumberDataPoint(time_unix_nano=ts, as_double=value,
                                               attributes=kvs(attrs))
                   for ts, value, attrs in points]
    metric = metrics_pb2.Metric(name=name, unit=unit,
                                gauge=metrics_pb2.Gauge(data_points=data_points))
    return METRICS.request(resource_metrics=[metrics_pb2.ResourceMetrics(
        resource=resource(service_name, host_name),
        scope_metrics=[metrics_pb2.ScopeMetrics(metrics=[metric])])])


def log_request(bodies: list[str], *, ts_ns: int | None = None,
                service_name: str = "vllm", host_name: str = "gpu-01") -> Any:
    """An ExportLogsServiceRequest with one record per body."""
    ts = ts_ns or time.time_ns()
    records = [logs_pb2.LogRecord(time_unix_nano=ts, severity_number=9, severity_text="INFO",
                                  body=any_value(body)) for body in bodies]
    return LOGS.request(resource_logs=[logs_pb2.ResourceLogs(
        resource=resource(service_name, host_name),
        scope_logs=[logs_pb2.ScopeLogs(log_records=records)])])


def signal_of(request: Any) -> Signal:
    """Which signal an Export request message belongs to."""
    for sig in (SPANS, METRICS, LOGS):
        if isinstance(request, sig.request):
            return sig
    raise TypeError(f"not an OTLP Export request: {type(request).__name__}")


#: Ports :func:`free_port` handed out in this process: the kernel may pick a port it just
#: gave back, so two calls in a row (a collector's gRPC and HTTP ports) could get the same
#: one, and the second server would take the first one's clients.
_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago and that no earlier call in this
    process returned."""
    for _ in range(1000):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError("no free TCP port on 127.0.0.1 that was not handed out already")


def _toml(config: Mapping[str, Any], prefix: str = "collector") -> str:
    return to_toml(config, prefix) + "\n"


@dataclass
class RunningCollector:
    """A collector subprocess started by :func:`running_collector`."""

    process: subprocess.Popen[bytes]
    data_dir: Path
    grpc_address: str
    http_address: str
    log_path: Path
    token: str | None = None
    channel_credentials: grpc.ChannelCredentials | None = None
    _channel: grpc.Channel | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def http_url(self) -> str:
        scheme = "https" if self.channel_credentials else "http"
        return f"{scheme}://{self.http_address}"

    def channel(self) -> grpc.Channel:
        """A gRPC channel to the collector (TLS when the collector uses it), reused."""
        if self._channel is None:
            options = [("grpc.max_send_message_length", 256 * 1024 * 1024)]
            self._channel = (grpc.secure_channel(self.grpc_address, self.channel_credentials,
                                                 options=options)
                             if self.channel_credentials
                             else grpc.insecure_channel(self.grpc_address, options=options))
        return self._channel

    def export(self, request: Any, *, timeout: float = 30.0,
               metadata: tuple[tuple[str, str], ...] | None = None) -> Any:
        """Send an Export request over gRPC; returns the response (raises grpc.RpcError)."""
        sig = signal_of(request)
        if metadata is None and self.token:
            metadata = (("authorization", f"Bearer {self.token}"),)
        call = self.channel().unary_unary(
            sig.grpc_method, request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=sig.response.FromString)
        return call(request, timeout=timeout, metadata=metadata)

    def export_bytes(self, sig: Signal, payload: bytes, *, timeout: float = 30.0,
                     metadata: tuple[tuple[str, str], ...] | None = None) -> Any:
        """Send raw bytes as an Export request body over gRPC."""
        if metadata is None and self.token:
            metadata = (("authorization", f"Bearer {self.token}"),)
        call = self.channel().unary_unary(sig.grpc_method, request_serializer=None,
                                          response_deserializer=sig.response.FromString)
        return call(payload, timeout=timeout, metadata=metadata)

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")

    def close_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait (SIGKILL after ``timeout``); returns the exit code."""
        self.close_channel()
        if self.process.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.process.wait()
        return self.process.returncode

    def kill(self, timeout: float = 10.0) -> None:
        """SIGKILL the collector and its workers at once (a crash), and wait until they are gone.

        The collector runs in its own process group (its PID is the group id), so this
        reaches only the processes this helper started.
        """
        self.close_channel()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.process.wait()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                os.killpg(self.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.02)
        raise TimeoutError(f"collector process group {self.pid} still alive after SIGKILL")


#: 127.0.0.1 as /proc/net/tcp writes it, and as an IPv4-mapped IPv6 address in tcp6.
LOOPBACK_HEX = frozenset({"0100007F", "0000000000000000FFFF00000100007F"})


def listening_addresses(port: int) -> set[str]:
    """Local addresses (hex, as in /proc/net/tcp) with a socket listening on TCP ``port``."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].split(":")
            if int(hex_port, 16) == port and fields[3] == "0A":  # 0A: LISTEN
                found.add(address)
    return found


def wait_for_port(address: str, timeout: float, process: subprocess.Popen[bytes]) -> None:
    """Wait until ``HOST:PORT`` accepts TCP connections (or the process exits)."""
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"collector exited with {process.returncode} before listening")
        with contextlib.suppress(OSError), socket.create_connection((host, int(port)), 0.2):
            return
        time.sleep(0.05)
    raise TimeoutError(f"collector did not listen on {address} within {timeout} s")


def exit_on_sigterm() -> None:
    """Make SIGTERM an exit for this process, so a benchmark or script that is killed still
    stops the collectors it started (each runs in a session of its own, stopped by its PID
    in :func:`running_collector`'s cleanup, which Python's default SIGTERM skips)."""
    def _exit(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, _exit)


def _limit_files(nofile: tuple[int, int]) -> Callable[[], None]:
    def limit() -> None:  # runs in the child between fork and exec
        rlimit.setrlimit(rlimit.RLIMIT_NOFILE, nofile)
    return limit


@contextlib.contextmanager
def running_collector(data_dir: str | os.PathLike[str], *, config: Mapping[str, Any] | None = None,
                      workers: int = 1, env: Mapping[str, str] | None = None,
                      grpc_port: int | None = None, http_port: int | None = None,
                      channel_credentials: grpc.ChannelCredentials | None = None,
                      start_timeout: float = 60.0,
                      nofile: tuple[int, int] | None = None) -> Iterator[RunningCollector]:
    """Start ``fleetlens collector`` on free loopback ports; stop it by PID on exit.

    Args:
        data_dir: the data directory (created if needed).
        config: ``[collector]`` settings written to a TOML file (nested dicts are tables).
        workers: worker processes.
        env: extra environment variables for the process.
        grpc_port, http_port: fixed ports (e.g. to restart on the same ones); free by default.
        channel_credentials: what :meth:`RunningCollector.channel` uses when TLS is on.
        start_timeout: seconds to wait for both ports to accept connections.
        nofile: the process's (soft, hard) ``RLIMIT_NOFILE`` (default: inherited).
    """
    data = Path(data_dir)
    data.mkdir(parents=True, exist_ok=True)
    grpc_address = f"127.0.0.1:{grpc_port or free_port()}"
    http_address = f"127.0.0.1:{http_port or free_port()}"
    settings = dict(config or {})
    config_path = data.parent / f".collector-{os.getpid()}-{time.monotonic_ns()}.toml"
    config_path.write_text(_toml(settings))
    log_path = data.parent / f"collector-{grpc_address.rpartition(':')[2]}.log"
    command = [sys.executable, "-m", "fleetlens", "collector", "--data-dir", str(data),
               "--config", str(config_path), "--grpc-address", grpc_address,
               "--http-address", http_address, "--workers", str(workers)]
    environment = {k: v for k, v in os.environ.items() if not k.startswith("FLEETLENS_")}
    environment.update(env or {})
    with open(log_path, "ab") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT,
                                   env=environment, start_new_session=True,
                                   preexec_fn=_limit_files(nofile) if nofile else None)
    tokens = settings.get("auth_tokens") or [None]
    running = RunningCollector(process, data, grpc_address, http_address, log_path,
                               token=tokens[0], channel_credentials=channel_credentials)
    try:
        wait_for_port(grpc_address, start_timeout, process)
        wait_for_port(http_address, start_timeout, process)
        yield running
    except BaseException:
        sys.stderr.write(f"--- collector log ({log_path}) ---\n{running.logs()[-5000:]}\n")
        raise
    finally:
        running.stop()
