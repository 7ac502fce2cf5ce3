"""What docs/telemetry.md tells vLLM users for TLS: OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=
http/protobuf, the CA in OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE, the token in
OTEL_EXPORTER_OTLP_TRACES_HEADERS and the full https://.../v1/traces URL as
--otlp-traces-endpoint. A child process builds the span exporter the way vLLM's
``get_span_exporter`` does for that protocol (the SDK's OTLP/HTTP ``OTLPSpanExporter`` with
only ``endpoint=``, everything else from the environment) and sends an ``llm_request`` span
to a real collector's HTTP receiver over TLS; the span is read back from the data dir."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fleetlens.collector.testing import running_collector
from fleetlens.pipeline.storage import DataDir, scan
from tests.collector.certs import make_pki

pytestmark = pytest.mark.e2e
TOKEN = "s3cret-token"

#: vLLM's get_span_exporter(endpoint) for "http/protobuf", then one request span.
CHILD = """
import os, sys
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
assert os.environ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"
provider = TracerProvider(resource=Resource.create({"service.name": "vllm"}))
provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=sys.argv[1])))
span = provider.get_tracer("vllm.llm_engine").start_span("llm_request")
span.set_attribute("gen_ai.request.id", "cmpl-tls-0")
span.end()
provider.shutdown()
"""


def _vllm_like_export(endpoint: str, ca: str) -> subprocess.CompletedProcess[str]:
    # requests (under the OTLP/HTTP exporter) lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE override
    # the exporter's CA file: the doc tells users to leave them unset for vLLM.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEETLENS_", "OTEL_"))
           and k not in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")}
    env.update(OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="http/protobuf",
               OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE=ca,
               OTEL_EXPORTER_OTLP_TRACES_HEADERS=f"authorization=Bearer%20{TOKEN}")
    return subprocess.run([sys.executable, "-c", CHILD, endpoint], env=env, text=True,
                          capture_output=True, timeout=120)


def test_vllm_spans_over_otlp_http_and_tls_as_documented(tmp_path) -> None:
    pki = make_pki(tmp_path / "pki")
    tls = {"cert_file": str(pki["server_cert"]), "key_file": str(pki["server_key"])}
    data = tmp_path / "data"
    with running_collector(data, config={"tls": tls, "auth_tokens": [TOKEN]}) as col:
        done = _vllm_like_export(f"https://{col.http_address}/v1/traces", str(pki["ca"]))
        assert done.returncode == 0, done.stderr
        assert "Failed to export" not in done.stderr, done.stderr
        # Without the path the exporter posts to "/": refused, nothing stored (the doc's warning)
        bare = _vllm_like_export(f"https://{col.http_address}", str(pki["ca"]))
        assert "Failed to export" in bare.stderr, bare.stderr
        assert col.stop() == 0
    spans = scan(DataDir(data), "spans").collect()
    assert spans["name"].to_list() == ["llm_request"]
