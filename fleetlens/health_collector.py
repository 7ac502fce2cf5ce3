"""``fleetlens health collector``: the collector's gRPC health service, over the collector's own
TLS settings.

The probe reads the same ``[collector]`` table (config file, ``FLEETLENS_COLLECTOR__*``) as the
collector it checks, so turning ``[collector.tls]`` on turns it on for the probe too: a
plaintext probe of a TLS collector fails every time, and a Docker HEALTHCHECK or a liveness
probe would restart a healthy collector for ever (issue 33 item 8). What it uses:

- the address: ``--address``, else the collector's ``grpc_address`` with a wildcard host
  (``0.0.0.0``, ``[::]``) dialled on 127.0.0.1;
- the CA: ``--ca``, else ``tls.ca_file``, else ``tls.cert_file`` itself (a self-signed
  certificate, or a file that ends with its CA's certificate);
- the name checked in the certificate: ``--server-name``, else ``tls.server_name``, else the
  host dialled;
- with mutual TLS (``tls.client_ca_file``), a client certificate: ``--cert``/``--key``, else the
  collector's own ``cert_file``/``key_file`` (right when one CA signs both and the certificate
  may be used by a client);
- the first of ``auth_tokens``, sent over TLS only (the health service itself asks for none).

Every failure is one line; the certificate is verified, never skipped: a probe that accepted
any certificate would call a stranger on the port healthy.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

_WILDCARDS = ("0.0.0.0", "::", "[::]", "")


@dataclass(frozen=True)
class ProbeTls:
    """What the probe's TLS handshake uses (files as given, read when dialling)."""

    ca_file: str
    server_name: str | None = None
    cert_file: str | None = None
    key_file: str | None = None


def local_address(grpc_address: str) -> str:
    """``grpc_address`` as a local probe dials it: a wildcard host becomes 127.0.0.1."""
    host, _, port = grpc_address.rpartition(":")
    return f"127.0.0.1:{port}" if host in _WILDCARDS else grpc_address


def probe_settings(config_file: str | None, address: str | None, ca: str | None,
                   cert: str | None, key: str | None, server_name: str | None,
                   ) -> tuple[str, ProbeTls | None, str | None]:
    """(address, TLS or None for plaintext, token) from the flags and the collector's config.

    Raises:
        click.ClickException: the config is invalid (one line naming the field).
    """
    from fleetlens.collector.cli import load
    from fleetlens.pipeline.schema.settings import ConfigError

    try:
        config, _ = load(config_file, {})
    except ConfigError as exc:
        raise click.ClickException(f"collector: invalid configuration: {exc}") from None
    tls = config.tls
    target = address or local_address(config.grpc_address)
    if not (tls.enabled or ca):
        return target, None, None
    mutual = tls.client_ca_file is not None or cert is not None
    probe = ProbeTls(
        ca_file=ca or tls.ca_file or str(tls.cert_file),
        server_name=server_name or tls.server_name,
        cert_file=(cert or tls.cert_file) if mutual else None,
        key_file=(key or tls.key_file) if mutual else None)
    if (probe.cert_file is None) != (probe.key_file is None):
        raise click.UsageError("--cert and --key go together")
    return target, probe, (config.auth_tokens[0] if config.auth_tokens else None)


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise click.ClickException(f"collector: cannot read the {what} {path}: "
                                   f"{exc.strerror or exc}") from None


def _channel(address: str, tls: ProbeTls | None) -> Any:
    import grpc

    if tls is None:
        return grpc.insecure_channel(address)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_read(tls.ca_file, "CA file"),
        private_key=_read(tls.key_file, "client key") if tls.key_file else None,
        certificate_chain=_read(tls.cert_file, "client certificate") if tls.cert_file else None)
    options = [("grpc.ssl_target_name_override", tls.server_name)] if tls.server_name else []
    return grpc.secure_channel(address, credentials, options=options)


def _why(details: str, tls: ProbeTls | None) -> str:
    """A one-line reason from gRPC's details (which may span lines and repeat itself)."""
    text = " ".join(details.split())
    lowered = text.lower()
    if tls is not None and "certificate_verify_failed" in lowered:
        return (f"the collector's certificate is not signed by {tls.ca_file} or not issued for "
                f"{tls.server_name or 'the address dialled'} (set --ca/--server-name or "
                "[collector.tls] ca_file/server_name)")
    if tls is not None and ("handshake" in lowered or "ssl" in lowered):
        return (f"TLS handshake failed ({text[:200]}); with mutual TLS, is the client "
                "certificate (--cert, default the collector's own) signed by client_ca_file?")
    if tls is None and ("socket closed" in lowered or "connection reset" in lowered):
        return (f"{text[:200]} (is the collector serving TLS? the probe reads [collector.tls] "
                "from the same config: pass --config or set FLEETLENS_CONFIG)")
    return text[:300]


def check_collector(address: str, timeout_s: float, tls: ProbeTls | None = None,
                    token: str | None = None) -> str:
    """'SERVING' or raise a one-line :class:`click.ClickException`: the collector's gRPC
    health service, in plaintext or over ``tls`` (certificate always verified)."""
    # gRPC core logs a failed handshake on stderr itself, before our line, if it reads this
    # unset when first imported: a probe says one line (GRPC_VERBOSITY set by hand still wins)
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    metadata = [("authorization", f"Bearer {token}")] if token and tls is not None else None
    with _channel(address, tls) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            answer = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s,
                                metadata=metadata)
        except grpc.RpcError as exc:
            raise click.ClickException(
                f"collector at {address}: {exc.code().name}: {_why(exc.details() or '', tls)}"
            ) from None
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
    if status != "SERVING":
        raise click.ClickException(f"collector at {address}: {status}")
    return status
