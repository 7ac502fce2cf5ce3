"""TLS and mutual TLS on both listeners: handshakes fail for plaintext clients, a wrong CA
and a missing client certificate; succeed with the right ones."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request

import grpc
import pytest

from fleetlens.collector.signals import SPANS
from fleetlens.collector.testing import running_collector, vllm_trace_request
from fleetlens.pipeline.storage import DataDir, scan
from tests.collector.certs import make_pki

pytestmark = pytest.mark.e2e


def _grpc_ok(address: str, credentials: grpc.ChannelCredentials | None) -> bool:
    channel = (grpc.secure_channel(address, credentials) if credentials
               else grpc.insecure_channel(address))
    call = channel.unary_unary(SPANS.grpc_method,
                               request_serializer=lambda m: m.SerializeToString(),
                               response_deserializer=SPANS.response.FromString)
    try:
        call(vllm_trace_request(2), timeout=5)
        return True
    except grpc.RpcError as error:
        assert error.code() == grpc.StatusCode.UNAVAILABLE
        return False
    finally:
        channel.close()


def _https_ok(url: str, context: ssl.SSLContext | None) -> bool:
    req = urllib.request.Request(f"{url}{SPANS.http_path}",
                                 data=vllm_trace_request(2).SerializeToString(),
                                 headers={"Content-Type": "application/x-protobuf"})
    try:
        with urllib.request.urlopen(req, timeout=5, context=context) as resp:
            return resp.status == 200
    except (urllib.error.URLError, ConnectionError, ssl.SSLError):
        return False


def _client_context(ca, cert=None, key=None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca))
    if cert:
        context.load_cert_chain(str(cert), str(key))
    return context


def _creds(ca, cert=None, key=None) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=ca.read_bytes(),
        private_key=key.read_bytes() if key else None,
        certificate_chain=cert.read_bytes() if cert else None)


def test_tls_only(tmp_path) -> None:
    pki = make_pki(tmp_path / "pki")
    tls = {"cert_file": str(pki["server_cert"]), "key_file": str(pki["server_key"])}
    with running_collector(tmp_path / "data", config={"tls": tls}) as col:
        https = f"https://{col.http_address}"
        assert _grpc_ok(col.grpc_address, _creds(pki["ca"]))
        assert not _grpc_ok(col.grpc_address, None)  # plaintext client
        assert not _grpc_ok(col.grpc_address, _creds(pki["other_ca"]))  # wrong CA
        assert _https_ok(https, _client_context(pki["ca"]))
        assert not _https_ok(f"http://{col.http_address}", None)  # plaintext
        assert not _https_ok(https, _client_context(pki["other_ca"]))
        col.stop()
    assert scan(DataDir(tmp_path / "data"), "spans").collect().height == 4


def test_mutual_tls(tmp_path) -> None:
    pki = make_pki(tmp_path / "pki")
    tls = {"cert_file": str(pki["server_cert"]), "key_file": str(pki["server_key"]),
           "client_ca_file": str(pki["ca"])}
    with running_collector(tmp_path / "data", config={"tls": tls}) as col:
        https = f"https://{col.http_address}"
        client = (pki["ca"], pki["client_cert"], pki["client_key"])
        assert _grpc_ok(col.grpc_address, _creds(*client))
        assert not _grpc_ok(col.grpc_address, _creds(pki["ca"]))  # no client certificate
        assert not _grpc_ok(col.grpc_address, None)
        assert _https_ok(https, _client_context(*client))
        assert not _https_ok(https, _client_context(pki["ca"]))  # no client certificate
        # a client certificate from another CA
        wrong = make_pki(tmp_path / "pki2")
        assert not _https_ok(https, _client_context(pki["ca"], wrong["client_cert"],
                                                    wrong["client_key"]))
        col.stop()
    assert scan(DataDir(tmp_path / "data"), "spans").collect().height == 4
