"""Issue 16, item 3: one bad value costs only its own item, never the whole Export.

A NaN summary quantile (what Prometheus exposes for an empty summary), a histogram count of
2^63 or more and a log ``observed_time_unix_nano`` of 2^64-1 used to make building the Arrow
table fail for the whole request, answered UNAVAILABLE: clients retried forever and the valid
items were never stored. Against a real collector over gRPC and OTLP/HTTP.
"""

from __future__ import annotations

import json
import math
import time
import urllib.request

import pyarrow as pa
import pytest
from opentelemetry.proto.logs.v1 import logs_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2

from fleetlens.collector.decode_common import Outcome
from fleetlens.collector.rows import to_table
from fleetlens.collector.signals import LOGS, METRICS
from fleetlens.collector.testing import log_request, resource, running_collector
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, scan

pytestmark = pytest.mark.e2e
NS = 10**9


def _metrics_request(now: int) -> metrics_pb2.MetricsData:
    """A gauge point, a summary with NaN quantiles and a histogram with count 2^63."""
    gauge = metrics_pb2.Metric(name="ok_gauge", gauge=metrics_pb2.Gauge(data_points=[
        metrics_pb2.NumberDataPoint(time_unix_nano=now, as_double=1.5)]))
    summary = metrics_pb2.Metric(name="empty_summary", summary=metrics_pb2.Summary(data_points=[
        metrics_pb2.SummaryDataPoint(
            time_unix_nano=now, count=0, sum=0.0,
            quantile_values=[metrics_pb2.SummaryDataPoint.ValueAtQuantile(
                quantile=q, value=math.nan) for q in (0.5, 0.99)])]))
    histogram = metrics_pb2.Metric(name="huge_histogram", histogram=metrics_pb2.Histogram(
        aggregation_temporality=2, data_points=[
            metrics_pb2.HistogramDataPoint(time_unix_nano=now, count=2**63, sum=1.0,
                                           bucket_counts=[2**63], explicit_bounds=[]),
            metrics_pb2.HistogramDataPoint(time_unix_nano=now, count=3, sum=1.0,
                                           bucket_counts=[1, 2**64 - 1],
                                           explicit_bounds=[1.0]),
            metrics_pb2.HistogramDataPoint(time_unix_nano=now, count=3, sum=1.0,
                                           bucket_counts=[1, 2], explicit_bounds=[1.0])]))
    return METRICS.request(resource_metrics=[metrics_pb2.ResourceMetrics(
        resource=resource("agent", "gpu-01"),
        scope_metrics=[metrics_pb2.ScopeMetrics(metrics=[gauge, summary, histogram])])])


def _logs_request(now: int) -> logs_pb2.LogsData:
    request = log_request(["fine", "observed in year 2554", "also fine"], ts_ns=now)
    records = request.resource_logs[0].scope_logs[0].log_records
    records[1].observed_time_unix_nano = 2**64 - 1
    return request


def _post(col, path: str, body: bytes, response_type):
    req = urllib.request.Request(f"{col.http_url}{path}", data=body,
                                 headers={"Content-Type": "application/x-protobuf"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200
        return response_type.FromString(resp.read())


def test_bad_values_reject_their_item_and_the_rest_is_stored(tmp_path) -> None:
    data = tmp_path / "data"
    now = time.time_ns()
    with running_collector(data) as col:
        # gRPC: OK with an exact partial success (two histogram points), not UNAVAILABLE
        response = col.export(_metrics_request(now))
        assert response.partial_success.rejected_data_points == 2
        assert "does not fit a signed 64-bit integer" in response.partial_success.error_message
        response = col.export(_logs_request(now))
        assert response.partial_success.rejected_log_records == 1
        assert "observed_time_unix_nano" in response.partial_success.error_message
        # OTLP/HTTP: 200 with the same partial success
        response = _post(col, METRICS.http_path, _metrics_request(now + 1).SerializeToString(),
                         METRICS.response)
        assert response.partial_success.rejected_data_points == 2
        response = _post(col, LOGS.http_path, _logs_request(now + 1).SerializeToString(),
                         LOGS.response)
        assert response.partial_success.rejected_log_records == 1
        assert col.stop() == 0
    points = scan(DataDir(data), t.METRIC_POINTS).collect()
    assert sorted(points[c.METRIC_NAME].to_list()) == sorted(
        ["ok_gauge", "empty_summary", "huge_histogram"] * 2)
    quantiles = points.filter(points[c.METRIC_NAME] == "empty_summary")[c.QUANTILES]
    assert json.loads(quantiles[0]) == [{"quantile": 0.5, "value": "NaN"},
                                        {"quantile": 0.99, "value": "NaN"}]
    assert points.filter(points[c.METRIC_NAME] == "huge_histogram")[c.COUNT].to_list() == [3, 3]
    logs = scan(DataDir(data), t.LOG_RECORDS).collect()
    assert sorted(logs[c.BODY].to_list()) == ["also fine", "also fine", "fine", "fine"]


def test_an_unstorable_row_that_slips_through_is_rejected_alone() -> None:
    """The safety net under the decoders: a value Arrow cannot hold rejects its row only."""
    columns = {name: [] for name in METRICS.arrow_schema.names}
    for count in (1, 2**64 - 1, 3):
        for name in columns:
            columns[name].append(None)
        columns[c.COUNT][-1] = count
        columns[c.TS_NS][-1] = 1
    outcome = Outcome(columns=columns, rows=3)
    table = to_table(METRICS, outcome)
    assert isinstance(table, pa.Table) and table[c.COUNT].to_pylist() == [1, 3]
    assert outcome.rows == 2 and outcome.rejected == 1
    assert "not storable" in outcome.error_message
