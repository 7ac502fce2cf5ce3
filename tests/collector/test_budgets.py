"""Issue 16, item 7: budgets per source, caps on every free-form field, nothing unknown in
the WAL, OTLP/JSON cut while parsing. Against a real collector over gRPC and OTLP/HTTP."""

from __future__ import annotations

import json
import time
import urllib.request

import grpc
import pytest
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from fleetlens.collector.decode_common import OVERFLOW_NAME
from fleetlens.collector.lite_spans import LiteRequest
from fleetlens.collector.otlp_json import to_json
from fleetlens.collector.signals import METRICS, SPANS
from fleetlens.collector.testing import (
    any_value,
    gauge_request,
    resource,
    running_collector,
    trace_request,
    vllm_span,
)
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, scan

pytestmark = pytest.mark.e2e


def _many_names(count: int, prefix: str) -> object:
    """One request whose every span comes from its own service and host."""
    return SPANS.request(resource_spans=[trace_pb2.ResourceSpans(
        resource=resource(f"{prefix}-svc-{i}", f"{prefix}-host-{i}"),
        scope_spans=[trace_pb2.ScopeSpans(spans=[vllm_span()])]) for i in range(count)])


def _connection(col):
    """A call on a new connection of its own (no subchannel shared with other channels)."""
    channel = grpc.insecure_channel(col.grpc_address,
                                    options=[("grpc.use_local_subchannel_pool", 1)])
    call = channel.unary_unary(SPANS.grpc_method,
                               request_serializer=lambda m: m.SerializeToString(),
                               response_deserializer=SPANS.response.FromString)
    return channel, call


def _metrics(col) -> dict[str, float]:
    with urllib.request.urlopen(f"{col.http_url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


def _spans(data) -> object:
    return scan(DataDir(data), t.SPANS).collect()


def test_one_client_with_thousands_of_names_cannot_evict_the_names_of_others(tmp_path) -> None:
    data = tmp_path / "data"
    with running_collector(data) as col:
        noisy, call = _connection(col)
        call(_many_names(10_000, "noisy"), timeout=60)
        noisy.close()
        col.export(trace_request([vllm_span()], service_name="checkout", host_name="gpu-real"))
        assert col.stop() == 0
    spans = _spans(data)
    real = spans.filter(spans[c.SERVICE_NAME] == "checkout")
    assert real.height == 1 and real[c.HOST_NAME].to_list() == ["gpu-real"]  # not overflow
    noisy_names = set(spans[c.SERVICE_NAME]) | set(spans[c.HOST_NAME])
    # 100 new names per request (service and host names alike), the rest in the bucket
    assert len(noisy_names - {"checkout", "gpu-real", OVERFLOW_NAME}) == 100
    assert spans.filter(spans[c.SERVICE_NAME] == OVERFLOW_NAME).height > 9_000


def test_each_connection_has_its_own_budget_of_new_names(tmp_path) -> None:
    data = tmp_path / "data"
    config = {"max_new_names_per_request": 10, "max_new_names_per_connection": 15}
    with running_collector(data, config=config) as col:
        first, call = _connection(col)
        call(_many_names(5, "a"), timeout=30)   # 10 new names: all kept
        call(_many_names(5, "b"), timeout=30)   # 10 more: 5 left on this connection
        second, other = _connection(col)
        other(_many_names(5, "c"), timeout=30)  # a fresh connection: all kept
        first.close()
        second.close()
        assert col.stop() == 0
    spans = _spans(data)
    names = set(spans[c.SERVICE_NAME]) | set(spans[c.HOST_NAME])
    for prefix, kept in (("a", 10), ("b", 5), ("c", 10)):
        assert sum(1 for n in names if n.startswith(f"{prefix}-")) == kept, prefix


def test_free_form_fields_keys_and_lists_are_capped(tmp_path) -> None:
    data = tmp_path / "data"
    span = vllm_span()
    span.trace_state = "k=" + "v" * 100_000
    span.attributes.add(key="long." + "k" * 10_000, value=any_value("x"))
    span.attributes.add(key="list", value=any_value(list(range(100_000))))
    request = trace_request([span])
    request.resource_spans[0].schema_url = "https://" + "u" * 100_000
    scope_spans = request.resource_spans[0].scope_spans[0]
    scope_spans.schema_url = "https://" + "s" * 100_000
    scope_spans.scope.CopyFrom(common_pb2.InstrumentationScope(
        name="n" * 100_000, version="9" * 100_000))
    with running_collector(data) as col:
        assert not col.export(request).HasField("partial_success")
        assert col.stop() == 0
    row = _spans(data).row(0, named=True)
    for column in (c.TRACE_STATE, c.RESOURCE_SCHEMA_URL, c.SCOPE_SCHEMA_URL, c.SCOPE_NAME,
                   c.SCOPE_VERSION):
        assert len(row[column]) == 1024, column  # max_name_bytes
    attrs = json.loads(row[c.ATTRIBUTES])
    assert len(attrs["list"]) == 1024  # max_attribute_list_items
    long_keys = [k for k in attrs if k.startswith("long.")]
    assert [len(k) for k in long_keys] == [256]  # max_attribute_key_bytes


def _with_unknown_field(payload: bytes, size: int) -> bytes:
    """``payload`` plus a length-delimited field number 99, which OTLP does not define."""
    tag, length, out = (99 << 3) | 2, size, bytearray()
    for value in (tag, length):
        while value >= 0x80:
            out.append(value & 0x7F | 0x80)
            value >>= 7
        out.append(value)
    return payload + bytes(out) + b"\xab" * size


def test_unknown_protobuf_fields_do_not_reach_the_wal(tmp_path) -> None:
    data = tmp_path / "data"
    # at the top of a span request
    on_top = _with_unknown_field(trace_request([vllm_span()]).SerializeToString(), 1_000_000)
    # inside one span attribute (the decoder reads those as raw bytes)
    lite = LiteRequest.FromString(trace_request([vllm_span()]).SerializeToString())
    attribute = common_pb2.KeyValue(key="x", value=any_value("y")).SerializeToString()
    lite.resource_spans[0].scope_spans[0].spans[0].attributes.append(
        _with_unknown_field(attribute, 500_000))
    in_attribute = lite.SerializeToString()
    # inside a metric data point
    points = gauge_request("g", [(time.time_ns(), 1.0, {})])
    in_point = points.SerializeToString()
    with running_collector(data) as col:
        for sig, payload in ((SPANS, on_top), (SPANS, in_attribute), (METRICS, in_point),
                             (METRICS, _with_unknown_field(in_point, 500_000))):
            assert not col.export_bytes(sig, payload).HasField("partial_success")
        metrics = _metrics(col)
        assert metrics["fleetlens_collector_wal_bytes_total"] < 20_000  # not the 2 MB
        assert metrics["fleetlens_collector_unknown_field_requests_total"] == 3
        assert col.stop() == 0
    spans = _spans(data)
    assert spans.height == 2
    assert sorted(json.loads(a).get("x", "") for a in spans[c.ATTRIBUTES]) == ["", "y"]


def test_otlp_json_attributes_are_cut_while_parsing(tmp_path) -> None:
    data = tmp_path / "data"
    span = vllm_span()
    body = json.loads(to_json(trace_request([span])))
    attributes = body["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["attributes"]
    attributes += [{"key": f"k{i}", "value": {"intValue": str(i)}} for i in range(200_000)]
    total = len(attributes)
    with running_collector(data) as col:
        req = urllib.request.Request(f"{col.http_url}{SPANS.http_path}",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        started = time.monotonic()
        with urllib.request.urlopen(req, timeout=120) as resp:
            assert resp.status == 200
        # the WAL holds the request as the limits left it, not 200,000 attributes
        assert _metrics(col)["fleetlens_collector_wal_bytes_total"] < 20_000
        assert col.stop() == 0
    print(f"200,000-attribute JSON span answered in {time.monotonic() - started:.2f} s")
    row = _spans(data).row(0, named=True)
    kept = len(json.loads(row[c.ATTRIBUTES])) + sum(
        1 for col in t.table(t.SPANS).columns if col.startswith("gen_ai_") and row[col] is not None)
    assert kept == 128
    assert row[c.DROPPED_ATTRIBUTES_COUNT] == total - 128
