"""OTLP/gRPC receiver: TraceService, MetricsService and LogsService Export, plus health.

A generic handler without a request deserializer hands the raw bytes to
:class:`collector.ingest.Ingest`, so an undecodable body becomes INVALID_ARGUMENT rather than
grpcio's INTERNAL. Messages larger than ``max_request_bytes`` (after decompression) are
refused by grpcio itself with RESOURCE_EXHAUSTED and no RetryInfo.
"""

from __future__ import annotations

from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from fleetlens.collector.config import CollectorConfig
from fleetlens.collector.errors import ExportError, StorageFailure, abort_grpc
from fleetlens.collector.ingest import Ingest
from fleetlens.collector.signals import BY_METHOD, SIGNALS, Signal
from fleetlens.collector.telemetry import log

_AUTHORIZATION = "authorization"


def _serialize(message: Any) -> bytes:
    return message.SerializeToString()


class _ExportHandler(grpc.GenericRpcHandler):
    def __init__(self, ingest: Ingest) -> None:
        self.ingest = ingest

    def service(self, handler_call_details: Any) -> grpc.RpcMethodHandler | None:
        signal = BY_METHOD.get(handler_call_details.method)
        if signal is None:
            return None  # UNIMPLEMENTED

        def export(payload: bytes, context: grpc.ServicerContext) -> Any:
            return self._export(signal, payload, context)

        return grpc.unary_unary_rpc_method_handler(
            export, request_deserializer=None, response_serializer=_serialize)

    def _export(self, signal: Signal, payload: bytes, context: grpc.ServicerContext) -> Any:
        try:
            metadata = dict(context.invocation_metadata() or ())
            self.ingest.authenticate(metadata.get(_AUTHORIZATION))
            # peer ("ipv4:127.0.0.1:51234") names the connection for its name budget.
            return self.ingest.export(signal, payload, peer=context.peer(), transport="grpc")
        except ExportError as error:
            abort_grpc(context, error)
        except Exception as exc:  # a bug must never look like success: retryable refusal
            log.exception("Export failed unexpectedly")
            abort_grpc(context, StorageFailure(f"internal error: {type(exc).__name__}"))


def _credentials(config: CollectorConfig) -> grpc.ServerCredentials | None:
    tls = config.tls
    if not tls.enabled:
        return None
    try:
        pair = (Path(tls.key_file).read_bytes(), Path(tls.cert_file).read_bytes())
        client_ca = Path(tls.client_ca_file).read_bytes() if tls.client_ca_file else None
    except OSError as exc:
        raise RuntimeError(f"cannot read TLS files for OTLP/gRPC: {exc}") from None
    return grpc.ssl_server_credentials(
        [pair], root_certificates=client_ca, require_client_auth=client_ca is not None)


def start_grpc(config: CollectorConfig, ingest: Ingest, threads: int = 8) -> grpc.Server:
    """Start the gRPC server on ``config.grpc_address`` (SO_REUSEPORT on, so workers share it).

    Raises:
        RuntimeError: the address could not be bound.
    """
    limit = config.max_request_bytes
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="grpc"),
        handlers=[_ExportHandler(ingest)],
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", 4 * 1024 * 1024),
            ("grpc.so_reuseport", 1),
        ],
    )
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ("", *(s.grpc_method.split("/")[1] for s in SIGNALS)):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    credentials = _credentials(config)
    address = config.grpc_address
    try:
        port = (server.add_secure_port(address, credentials) if credentials
                else server.add_insecure_port(address))
    except RuntimeError as exc:
        raise RuntimeError(f"cannot listen for OTLP/gRPC on {address}: {exc}") from None
    if not port:
        raise RuntimeError(f"cannot listen for OTLP/gRPC on {address}")
    server.start()
    server.health = health_servicer  # type: ignore[attr-defined]
    return server
