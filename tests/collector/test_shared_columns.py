"""Issue 16, item 4: resource and scope columns are buffered once per request.

A worker buffers the resource/scope columns as Arrow dictionaries: a request of 400 spans
under a 1.5 MB resource and scope costs the buffer about 1.5 MB, not 400 copies (600 MB,
which was refused as "can ever hold"). Published Parquet reads back as plain strings, with
exactly the values and types it had before. Against a real collector over gRPC.
"""

from __future__ import annotations

import json
import time

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from opentelemetry.proto.common.v1 import common_pb2

from fleetlens.collector.signals import SIGNALS
from fleetlens.collector.testing import (
    gauge_request,
    log_request,
    running_collector,
    trace_request,
    vllm_span,
)
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, scan

pytestmark = pytest.mark.e2e

ATTRS, SIZE, SPANS = 120, 6000, 400  # the 795 KB request of the issue (max_attributes: 128)


def _big_request(tag: str):
    """400 spans under 120 resource and 120 scope attributes of 6 KB each."""
    big = {f"big.{i}": tag + chr(ord("a") + i % 26) * SIZE for i in range(ATTRS)}
    request = trace_request([vllm_span() for _ in range(SPANS)], service_name=f"svc-{tag}",
                            host_name="host-big", **big)
    scope = request.resource_spans[0].scope_spans[0].scope
    scope.attributes.extend([common_pb2.KeyValue(key=f"s{i}", value=common_pb2.AnyValue(
        string_value=tag + "z" * SIZE)) for i in range(ATTRS)])
    return request


def test_a_resource_costs_the_buffer_once_per_request_not_once_per_span(tmp_path) -> None:
    """With the resource cap raised, each request carries 1.5 MB of resource and scope text
    on 400 spans. The old buffer counted 400 copies (630 MB against a 24 MB buffer) and
    refused every request permanently; now six of them (two resources, one segment) fit."""
    config = {"max_buffered_bytes": 24 * 1024 * 1024, "max_resource_bytes": 4 * 1024 * 1024,
              "max_request_bytes": 8 * 1024 * 1024, "flush_rows": 100_000,
              "flush_interval_s": 60.0}
    data = tmp_path / "data"
    with running_collector(data, config=config) as col:
        for i in range(6):
            response = col.export(_big_request("ab"[i % 2]))
            assert not response.HasField("partial_success")
        assert col.stop() == 0
    spans = scan(DataDir(data), t.SPANS).collect()
    assert spans.height == 6 * SPANS
    assert spans.schema[c.RESOURCE_ATTRIBUTES] == pl.String
    assert spans.schema[c.SCOPE_ATTRIBUTES] == pl.String
    for tag in "ab":
        mine = spans.filter(pl.col(c.SERVICE_NAME) == f"svc-{tag}")
        assert mine.height == 3 * SPANS
        assert mine[c.RESOURCE_ATTRIBUTES].n_unique() == 1
        resource = json.loads(mine[c.RESOURCE_ATTRIBUTES][0])
        assert len(resource) == ATTRS + 2  # nothing dropped: the cap was raised
        assert resource["big.0"] == tag + "a" * SIZE
        scope = json.loads(mine[c.SCOPE_ATTRIBUTES][0])
        assert len(scope) == ATTRS and scope["s1"] == tag + "z" * SIZE


def test_segments_read_back_with_the_raw_tables_plain_types(tmp_path) -> None:
    """Every published segment's Arrow schema is the raw table's, strings not dictionaries,
    while Parquet still stores the resource columns dictionary-encoded."""
    data = tmp_path / "data"
    with running_collector(data) as col:
        col.export(trace_request([vllm_span() for _ in range(30)], service_name="s1"))
        col.export(trace_request([vllm_span() for _ in range(20)], service_name="s2"))
        col.export(gauge_request("g", [(time.time_ns(), 1.0, {"gpu": "0"})]))
        col.export(log_request(["one", "two"]))
        assert col.stop() == 0
    seen = set()
    for signal in SIGNALS:
        files = sorted((data / "raw" / signal.folder).rglob("*.parquet"))
        assert files, signal.folder
        seen.add(signal.folder)
        for path in files:
            schema = pq.read_schema(path)
            assert schema.remove_metadata().equals(signal.arrow_schema.remove_metadata()), path
            assert not any(pa.types.is_dictionary(f.type) for f in pq.read_table(path).schema)
            column = pq.ParquetFile(path).metadata.row_group(0).column(
                schema.get_field_index(c.RESOURCE_ATTRIBUTES))
            assert column.has_dictionary_page, path
    assert seen == {"spans", "metrics", "logs"}
    spans = scan(DataDir(data), t.SPANS).collect()
    assert sorted(spans[c.SERVICE_NAME].value_counts(sort=True).rows()) == [("s1", 30), ("s2", 20)]
    assert set(spans[c.HOST_NAME]) == {"gpu-01"}
