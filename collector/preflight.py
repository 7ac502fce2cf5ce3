"""Checks before the collector forks its workers: ports free, exposure said out loud.

With several workers, a port held by another program made each worker fail and restart
three times (about 90 lines of tracebacks) before the supervisor gave up. One trial bind
finds it first and says so in one line. The trial bind does *not* set SO_REUSEPORT, which
the workers set to share the port: with it, a port already served by another collector (or
anything else binding with SO_REUSEPORT as the same user) passed, and the kernel then split
the clients between the two servers without a word.
"""

from __future__ import annotations

import socket

from fleetlens.collector.config import CollectorConfig
from fleetlens.collector.telemetry import log
from fleetlens.pipeline.schema.settings import is_loopback


class PortInUse(RuntimeError):
    """A listening address is taken by another program."""


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def check_ports_free(config: CollectorConfig) -> None:
    """Bind each listening address once, alone: SO_REUSEADDR (a closed server's connections
    in TIME_WAIT do not count), not SO_REUSEPORT (a listener of any program does).

    Raises:
        PortInUse: naming the address and the setting that chose it.
    """
    for setting in ("grpc_address", "http_address"):
        address = getattr(config, setting)
        host, port = _host_port(address)
        for family, kind, proto, _, where in socket.getaddrinfo(host, port,
                                                                type=socket.SOCK_STREAM):
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    probe.bind(where)
                except OSError as exc:
                    raise PortInUse(f"cannot listen on {address} ({setting}): {exc.strerror}; "
                                    "another program holds it, or pick another with "
                                    f"--{setting.replace('_', '-')}") from None
            break  # the first address the name resolves to is the one the worker binds


def _is_loopback(host: str) -> bool:
    # a host name is resolved as the server will bind it
    return is_loopback(host, resolve=True)


def unauthenticated_reason(config: CollectorConfig) -> str | None:
    """Why anyone who reaches a listener may write telemetry, or None when clients must prove
    who they are (a bearer token, or a certificate from ``tls.client_ca_file``).

    Server TLS alone encrypts the stream but lets any client in.
    """
    if config.auth_tokens or config.tls.client_ca_file:
        return None
    if config.tls.enabled:
        return ("TLS is on but neither auth_tokens nor client certificates "
                "(tls.client_ca_file) are required")
    return "neither auth_tokens nor TLS is configured"


def warn_if_exposed(config: CollectorConfig) -> list[str]:
    """Log (and return) a warning for each non-loopback listener that any client may use."""
    reason = unauthenticated_reason(config)
    if reason is None:
        return []
    warnings = []
    for setting in ("grpc_address", "http_address"):
        address = getattr(config, setting)
        if not _is_loopback(_host_port(address)[0]):
            warnings.append(f"{setting} {address} is not loopback and {reason}: anyone who "
                            "reaches it can write telemetry (docs/collector.md, security)")
    for warning in warnings:
        log.warning(warning)
    return warnings
