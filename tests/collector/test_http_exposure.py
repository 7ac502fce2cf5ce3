"""Issue 11: server TLS alone still lets any client send, so it is warned about like no TLS."""

from __future__ import annotations

import logging

from fleetlens.collector.config import CollectorConfig, TlsConfig
from fleetlens.collector.preflight import warn_if_exposed

SERVER_TLS = TlsConfig(cert_file="c.pem", key_file="k.pem")


def test_server_tls_without_client_auth_or_tokens_is_warned_about(caplog) -> None:
    exposed = CollectorConfig(http_address="0.0.0.0:4318", tls=SERVER_TLS)
    with caplog.at_level(logging.WARNING, logger="fleetlens.collector"):
        (warning,) = warn_if_exposed(exposed)
    assert warning.startswith("http_address 0.0.0.0:4318 is not loopback and TLS is on but "
                              "neither auth_tokens nor client certificates")
    assert "anyone who reaches it can write telemetry" in warning
    assert warning in caplog.text


def test_client_certificates_or_tokens_silence_the_warning() -> None:
    mutual = TlsConfig(cert_file="c.pem", key_file="k.pem", client_ca_file="ca.pem")
    assert warn_if_exposed(CollectorConfig(grpc_address="0.0.0.0:4317", tls=mutual)) == []
    assert warn_if_exposed(CollectorConfig(grpc_address="0.0.0.0:4317", tls=SERVER_TLS,
                                           auth_tokens=("t",))) == []
    # on loopback, server TLS alone is fine
    assert warn_if_exposed(CollectorConfig(tls=SERVER_TLS)) == []
