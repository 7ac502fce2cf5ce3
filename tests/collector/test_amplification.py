"""Issue 16, item 4: resource and scope attributes cannot amplify a request in memory.

The resource's attribute JSON is copied onto every row of its spans: a 795 KB request (128
resource attributes of 6 KB over 400 spans) became 318 MB of Arrow strings, took a worker from
109 MB to 720 MB and was told "buffer full, retry" (a retry that could never succeed). Now the
resource and scope JSON is capped per resource, and rows that could never fit the buffer are
refused permanently. Against a real collector over gRPC and OTLP/HTTP.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import grpc
import pytest
from opentelemetry.proto.common.v1 import common_pb2

from fleetlens.collector.errors import RETRY_INFO_KEY
from fleetlens.collector.signals import SPANS
from fleetlens.collector.testing import running_collector, trace_request, vllm_span
from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, scan

pytestmark = pytest.mark.e2e


def _amplifying_request(spans: int, attrs: int = 128, size: int = 6000):
    big = {f"big.{i}": chr(ord("a") + i % 26) * size for i in range(attrs)}
    request = trace_request([vllm_span() for _ in range(spans)], service_name="svc-big",
                            host_name="host-big", **big)
    scope = request.resource_spans[0].scope_spans[0].scope
    scope.attributes.extend([common_pb2.KeyValue(key=f"s{i}", value=common_pb2.AnyValue(
        string_value="z" * size)) for i in range(attrs)])
    return request


def test_large_resource_attributes_are_capped_not_copied_onto_every_row(tmp_path) -> None:
    data = tmp_path / "data"
    request = _amplifying_request(400)
    assert request.ByteSize() < 2_000_000  # 2 x 786 KB of attributes, 400 small spans
    with running_collector(data) as col:
        response = col.export(request)  # was UNAVAILABLE "buffer full; retry later"
        assert not response.HasField("partial_success")
        assert col.stop() == 0
    spans = scan(DataDir(data), t.SPANS).collect()
    assert spans.height == 400
    assert (spans[c.SERVICE_NAME].unique().to_list(), spans[c.HOST_NAME].unique().to_list()) \
        == (["svc-big"], ["host-big"])
    for column in (c.RESOURCE_ATTRIBUTES, c.SCOPE_ATTRIBUTES):
        text = spans[column][0]
        assert len(text.encode()) <= 16 * 1024, column
        kept = json.loads(text)
        assert 0 < len(kept) < 128
    resource = json.loads(spans[c.RESOURCE_ATTRIBUTES][0])
    assert (resource[a.SERVICE_NAME], resource[a.HOST_NAME]) == ("svc-big", "host-big")


def test_rows_that_can_never_fit_the_buffer_are_a_permanent_refusal(tmp_path) -> None:
    # The resource and scope are buffered once per request (test_shared_columns.py): what
    # cannot fit here is the 600 spans' own rows, about 300 KB against a 128 KiB buffer.
    config = {"max_buffered_bytes": 128 * 1024, "max_resource_bytes": 8 * 1024}
    request = _amplifying_request(600, attrs=8, size=1000)
    with running_collector(tmp_path / "data", config=config) as col:
        with pytest.raises(grpc.RpcError) as info:
            col.export(request)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert RETRY_INFO_KEY not in dict(info.value.trailing_metadata() or ())
        assert "can ever hold" in info.value.details()
        http = urllib.request.Request(f"{col.http_url}{SPANS.http_path}",
                                      data=request.SerializeToString(),
                                      headers={"Content-Type": "application/x-protobuf"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(http, timeout=30)
        with refused.value as err:
            assert err.code == 413 and err.headers.get("Retry-After") is None
        # the same resource on a request that fits is accepted
        assert not col.export(_amplifying_request(20, attrs=8, size=1000)).HasField(
            "partial_success")
