"""Engine log records during collective stalls, in the real NCCL and PyTorch formats.

While a tensor-parallel instance's interconnect is stalled (``collective_stall``), each of its
ranks (one worker process per GPU) logs NCCL warnings now and then, and once the stall has
lasted :data:`WATCHDOG_TIMEOUT_MS` the PyTorch ``ProcessGroupNCCL`` watchdog of every rank
reports a collective timeout. (vLLM's default process-group timeout is far longer; the
simulated deployment sets a short one, as latency-sensitive fleets do, so that a stall of a few
minutes produces the timeout line.) Formats: docs/telemetry.md, "Log formats";
:mod:`pipeline.logsignal` parses them back. Nothing is logged outside stalls, and the random
draws come from their own generator: the simulation itself does not change.
"""

from __future__ import annotations

import random
import zlib
from datetime import UTC, datetime
from typing import Any

from fleetlens.simulator.engine import Instance

#: the simulated process group's collective timeout
WATCHDOG_TIMEOUT_MS = 60_000
#: mean seconds between two NCCL warnings of one rank during a stall
WARN_EVERY_S = 20.0
LOG_SCOPE = "fleetlens.simulator.engine_log"
SEVERITY_WARN, SEVERITY_ERROR = 13, 17  # OTLP SeverityNumber WARN, ERROR
#: (resource key, time ns, severity number, severity text, body)
LogRecord = tuple[str, int, int, str, str]


def nccl_warn_line(host: str, pid: int, tid: int, device: int, peer: str, port: int) -> str:
    """An NCCL warning as NCCL prints it (``NCCL_DEBUG=WARN``): a failed RDMA completion."""
    return (f"{host}:{pid}:{tid} [{device}] transport/net_ib.cc:1296 NCCL WARN NET/IB : Got "
            f"completion from peer {peer}<{port}> with error 12, opcode 0, len 0, "
            "vendor err 129 (Recv)")


def watchdog_line(ts_ns: int, rank: int, tid: int, seq: int, numel: int, timeout_ms: int,
                  ran_ms: int) -> str:
    """The PyTorch ProcessGroupNCCL watchdog's timeout of one collective (glog prefix)."""
    at = datetime.fromtimestamp(ts_ns / 1e9, UTC)
    return (f"[rank{rank}]:[E{at:%m%d %H:%M:%S.%f} {tid} ProcessGroupNCCL.cpp:632] "
            f"[PG ID 0 PG GUID 0(default_pg) Rank {rank}] Watchdog caught collective operation "
            f"timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn={numel}, "
            f"NumelOut={numel}, Timeout(ms)={timeout_ms}) ran for {ran_ms} milliseconds "
            "before timing out.")


class StallLogger:
    """Produces the log records of stalled instances, tick by tick."""

    def __init__(self, seed: int, start_ns: int, pids: dict[str, int]) -> None:
        self.rng = random.Random(f"{seed}:engine-logs")
        self.start_ns, self.pids = start_ns, pids
        self.stalled_since: dict[str, float] = {}  # instance id -> stall start (s)
        self.timed_out: set[str] = set()

    def tick(self, instances: list[Instance], t0: float, t1: float) -> list[LogRecord]:
        """Records logged in [t0, t1) by instances whose collectives are stalled."""
        out: list[LogRecord] = []
        for inst in instances:
            if inst.deployment.tp < 2 or inst.link_slowdown <= 1.0:
                self.stalled_since.pop(inst.id, None)
                self.timed_out.discard(inst.id)
                continue
            since = self.stalled_since.setdefault(inst.id, t0)
            pid = self.pids.get(inst.id, 1000)
            for rank, gpu in enumerate(inst.gpus):
                if self.rng.random() < (t1 - t0) / WARN_EVERY_S:
                    at = self.start_ns + round(self.rng.uniform(t0, t1) * 1e9)
                    peer = (f"10.{zlib.crc32(inst.host.encode()) % 200}.{rank}."
                            f"{(rank + 1) % len(inst.gpus) + 2}")
                    body = nccl_warn_line(inst.host, pid + rank, pid + rank + 41, gpu.index,
                                          peer, 40000 + self.rng.randrange(20000))
                    out.append((inst.id, at, SEVERITY_WARN, "WARN", body))
            if inst.id not in self.timed_out and since + WATCHDOG_TIMEOUT_MS / 1000 < t1:
                self.timed_out.add(inst.id)
                seq = int(t1 * 40 * inst.deployment.model.layers)  # all-reduces so far
                for rank in range(len(inst.gpus)):
                    ran = WATCHDOG_TIMEOUT_MS + self.rng.randint(1, 900)
                    at = self.start_ns + round((since + ran / 1000) * 1e9)
                    numel = inst.deployment.model.hidden * self.rng.randint(1, 256)
                    body = watchdog_line(at, rank, pid + rank + 7, seq, numel,
                                         WATCHDOG_TIMEOUT_MS, ran)
                    out.append((inst.id, at, SEVERITY_ERROR, "ERROR", body))
        return out


def logs_request(records: list[LogRecord], resources: dict[str, dict[str, str]]) -> Any:
    """An OTLP ``ExportLogsServiceRequest`` of ``records``, one ResourceLogs per resource."""
    from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
    from opentelemetry.proto.common.v1 import common_pb2
    from opentelemetry.proto.logs.v1 import logs_pb2
    from opentelemetry.proto.resource.v1 import resource_pb2

    by_resource: dict[str, list[LogRecord]] = {}
    for record in records:
        by_resource.setdefault(record[0], []).append(record)
    request = logs_service_pb2.ExportLogsServiceRequest()
    for key, items in by_resource.items():
        attrs = [common_pb2.KeyValue(key=k, value=common_pb2.AnyValue(string_value=v))
                 for k, v in resources.get(key, {}).items()]
        rl = request.resource_logs.add(resource=resource_pb2.Resource(attributes=attrs))
        scope = rl.scope_logs.add(scope=common_pb2.InstrumentationScope(name=LOG_SCOPE))
        for _, ts, number, text, body in items:
            scope.log_records.append(logs_pb2.LogRecord(
                time_unix_nano=ts, observed_time_unix_nano=ts, severity_number=number,
                severity_text=text, body=common_pb2.AnyValue(string_value=body)))
    return request


class GrpcLogSender:
    """Sends ``ExportLogsServiceRequest`` s over OTLP/gRPC (the SDK's log exporter is still
    experimental and would stamp its own times); returns the rejected count of each."""

    def __init__(self, endpoint: str, insecure: bool, timeout_s: float,
                 headers: dict[str, str] | None) -> None:
        import grpc
        from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc

        self.channel = (grpc.insecure_channel(endpoint) if insecure else
                        grpc.secure_channel(endpoint, grpc.ssl_channel_credentials()))
        self.stub = logs_service_pb2_grpc.LogsServiceStub(self.channel)
        self.timeout_s = timeout_s
        self.metadata = list((headers or {}).items())

    def __call__(self, request: Any) -> int:
        response = self.stub.Export(request, timeout=self.timeout_s, metadata=self.metadata)
        return response.partial_success.rejected_log_records

    def close(self) -> None:
        self.channel.close()
