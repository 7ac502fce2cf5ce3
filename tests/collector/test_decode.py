"""Typed columnar decoding: conventions of TEAM.md and per-item validation."""

from __future__ import annotations

import json
import random
import time

import polars as pl
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetlens.collector.decode_common import OVERFLOW_NAME, Limits
from fleetlens.collector.name_budget import NameLimiter
from fleetlens.collector.signals import LOGS, METRICS, SPANS
from fleetlens.collector.testing import gauge_request, kvs, log_request, trace_request, vllm_span
from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.schema import validate


def _limits(now: int | None = None, **kw) -> Limits:
    base = dict(now_ns=now or time.time_ns(), skew_ns=3600 * 10**9, max_attributes=128,
                max_value_bytes=8192)
    base.update(kw)
    return Limits(**base)


def _decode(sig, request, limits=None, names=None):
    now = time.time_ns()
    return sig.decode(request, limits or _limits(now), names or NameLimiter(100), now)


def test_vllm_span_promotes_gen_ai_keys_and_keeps_the_rest_as_json() -> None:
    span = vllm_span(random.Random(1))
    out = _decode(SPANS, trace_request([span], service_name="vllm-a", host_name="h1",
                                       region="eu"))
    assert out.rows == 1 and out.rejected == 0
    row = {k: v[0] for k, v in out.columns.items()}
    assert row[c.TRACE_ID] == span.trace_id.hex() and row[c.SPAN_ID] == span.span_id.hex()
    assert row[c.PARENT_SPAN_ID] == "" and row[c.KIND] == 2
    assert (row[c.SERVICE_NAME], row[c.HOST_NAME]) == ("vllm-a", "h1")
    assert json.loads(row[c.RESOURCE_ATTRIBUTES]) == {
        a.SERVICE_NAME: "vllm-a", a.HOST_NAME: "h1", "region": "eu"}
    attrs = json.loads(row[c.ATTRIBUTES])
    promoted = set(a.PROMOTED_SPAN_ATTRIBUTES)
    assert not promoted & set(attrs)
    assert set(attrs) == {a.GEN_AI_N, a.GEN_AI_TEMPERATURE, a.GEN_AI_TOP_P,
                          a.GEN_AI_FINISH_REASONS}
    source = {kv.key: kv.value for kv in span.attributes}
    for key, (column, _) in a.PROMOTED_SPAN_ATTRIBUTES.items():
        value = source[key]
        expected = value.string_value or value.double_value or value.int_value
        assert row[column] == expected, key
    table = SPANS.to_arrow(out)
    validate(pl.from_arrow(table), t.SPANS)


def test_attribute_value_types_follow_the_json_convention() -> None:
    span = vllm_span(random.Random(2))
    del span.attributes[:]
    span.attributes.extend(kvs({"s": "x", "b": True, "i": 7, "d": 1.5, "arr": [1, "a"],
                                "m": {"k": [False]}, "raw": b"\x00\xff",
                                a.GEN_AI_PROMPT_TOKENS: "not-an-int"}))
    out = _decode(SPANS, trace_request([span]))
    attrs = json.loads(out.columns[c.ATTRIBUTES][0])
    assert attrs == {"s": "x", "b": True, "i": 7, "d": 1.5, "arr": [1, "a"],
                     "m": {"k": [False]}, "raw": {"bytes_b64": "AP8="},
                     a.GEN_AI_PROMPT_TOKENS: "not-an-int"}
    assert out.columns[c.GEN_AI_PROMPT_TOKENS] == [None]


def test_invalid_spans_are_rejected_one_by_one_with_reasons() -> None:
    rng = random.Random(3)
    now = time.time_ns()
    good = vllm_span(rng)
    short_trace = vllm_span(rng, trace_id=b"abc")
    zero_span = vllm_span(rng, span_id=bytes(8))
    backwards = vllm_span(rng)
    backwards.end_time_unix_nano = backwards.start_time_unix_nano - 1
    future = vllm_span(rng, start_ns=now + 7200 * 10**9)
    zero_time = vllm_span(rng, start_ns=0)
    out = _decode(SPANS, trace_request([good, short_trace, zero_span, backwards, future,
                                        zero_time]))
    assert (out.rows, out.rejected) == (1, 5)
    assert "trace_id must be 16 bytes, got 3" in out.error_message
    assert out.error_message.startswith("rejected 5: span 1: ")
    response = SPANS.response_for(out)
    assert response.partial_success.rejected_spans == 5


def test_limits_truncate_values_and_attribute_counts() -> None:
    span = vllm_span(random.Random(4))
    del span.attributes[:]
    span.attributes.extend(kvs({f"k{i}": "é" * 100 for i in range(10)}))
    limits = _limits(max_attributes=4, max_value_bytes=11)
    out = _decode(SPANS, trace_request([span]), limits)
    attrs = json.loads(out.columns[c.ATTRIBUTES][0])
    assert list(attrs) == ["k0", "k1", "k2", "k3"]
    assert all(v == "é" * 5 for v in attrs.values())  # 10 bytes: no half character
    assert out.columns[c.DROPPED_ATTRIBUTES_COUNT] == [6]
    assert out.truncated > 0


def test_deep_nesting_rejects_the_span_not_the_request() -> None:
    value: object = "leaf"
    for _ in range(40):
        value = [value]
    deep = vllm_span(random.Random(5))
    deep.attributes.extend(kvs({"deep": value}))
    out = _decode(SPANS, trace_request([deep, vllm_span(random.Random(6))]))
    assert (out.rows, out.rejected) == (1, 1)


def test_cardinality_cap_sends_new_names_to_the_overflow_bucket() -> None:
    names = NameLimiter(2)
    services = [names.admit(s) for s in ("a", "b", "c", "a", "d")]
    assert services == ["a", "b", OVERFLOW_NAME, "a", OVERFLOW_NAME]
    assert names.overflowed == 2


def test_name_budgets_per_request_and_connection_keep_known_names() -> None:
    names = NameLimiter(100, per_request=2, per_connection=3)
    first = names.for_request("ipv4:127.0.0.1:1")
    assert [first.admit(n) for n in ("a", "b", "c", "a")] == ["a", "b", OVERFLOW_NAME, "a"]
    again = names.for_request("ipv4:127.0.0.1:1")  # same connection: one new name left
    assert [again.admit(n) for n in ("d", "e", "b")] == ["d", OVERFLOW_NAME, "b"]
    other = names.for_request("ipv4:127.0.0.1:2")
    assert [other.admit(n) for n in ("e", "f", "c")] == ["e", "f", OVERFLOW_NAME]
    assert names.for_request(None).admit("c") == "c"  # no connection known: per request only


def test_json_attribute_lists_are_cut_before_parsing() -> None:
    from fleetlens.collector.otlp_json import _prepare

    span = {"attributes": [{"key": f"k{i}"} for i in range(10)], "droppedAttributesCount": "2",
            "events": [{"attributes": [{"key": "x"}] * 5}],
            "traceId": "0102030405060708090a0b0c0d0e0f10"}
    _prepare(span, 4, 6)
    assert len(span["attributes"]) == 4 and span["droppedAttributesCount"] == 8
    assert len(span["events"][0]["attributes"]) == 4
    assert span["events"][0]["droppedAttributesCount"] == 1
    assert span["traceId"] == "AQIDBAUGBwgJCgsMDQ4PEA=="


def test_metrics_and_logs_decode_to_their_tables() -> None:
    now = time.time_ns()
    out = _decode(METRICS, gauge_request("hw.power", [(now, 250.0, {"hw.id": "GPU-1"}),
                                                      (0, 1.0, {})], unit="W"))
    assert (out.rows, out.rejected) == (1, 1)
    assert out.columns[c.VALUE] == [250.0] and out.columns[c.METRIC_KIND] == ["gauge"]
    assert METRICS.response_for(out).partial_success.rejected_data_points == 1
    logs = _decode(LOGS, log_request(["hello", "world"], ts_ns=now))
    assert logs.columns[c.BODY] == ["hello", "world"]
    assert isinstance(LOGS.to_arrow(logs), pa.Table)


def test_a_cumulative_sum_may_have_started_long_ago() -> None:
    from opentelemetry.proto.metrics.v1 import metrics_pb2

    now = time.time_ns()
    request = gauge_request("vllm.preemptions", [])
    metric = request.resource_metrics[0].scope_metrics[0].metrics[0]
    metric.sum.aggregation_temporality = 2
    metric.sum.is_monotonic = True
    metric.sum.data_points.append(metrics_pb2.NumberDataPoint(
        start_time_unix_nano=now - 30 * 86400 * 10**9, time_unix_nano=now, as_int=42))
    metric.sum.data_points.append(metrics_pb2.NumberDataPoint(
        start_time_unix_nano=now + 10**9, time_unix_nano=now, as_int=1))  # start after time
    out = _decode(METRICS, request)
    assert (out.rows, out.rejected) == (1, 1)
    assert out.columns[c.VALUE] == [42.0] and out.columns[c.TEMPORALITY] == ["cumulative"]
    assert out.columns[c.IS_MONOTONIC] == [True]


@settings(max_examples=150, deadline=None, derandomize=True)
@given(points=st.lists(st.tuples(
    st.sampled_from(["gauge", "sum", "histogram"]),
    # time offset from now in s (0 = unset), never near the 3600 s skew edge
    st.one_of(st.just(0), st.integers(-3500, 3500), st.integers(3700, 7200),
              st.integers(-7200, -3700)),
    st.integers(-10, 10),  # start offset from time in s
    st.integers(0, 4), st.integers(0, 4)), max_size=12))  # bucket counts, bounds
def test_metric_points_are_rejected_one_by_one_with_exact_counts(points) -> None:
    from opentelemetry.proto.metrics.v1 import metrics_pb2

    now = time.time_ns()
    request = gauge_request("m", [])
    scope = request.resource_metrics[0].scope_metrics[0]
    del scope.metrics[:]
    expected_bad = 0
    for kind, offset, start_offset, n_counts, n_bounds in points:
        ts = now + offset * 10**9 if offset else 0
        start = max(ts + start_offset * 10**9, 1) if ts else 0
        metric = scope.metrics.add(name=f"m.{kind}")
        if kind == "histogram":
            metric.histogram.data_points.append(metrics_pb2.HistogramDataPoint(
                time_unix_nano=ts, start_time_unix_nano=start, count=n_counts,
                bucket_counts=[1] * n_counts, explicit_bounds=[float(b) for b in range(n_bounds)]))
            shape_ok = n_counts == 0 or n_counts == n_bounds + 1
        else:
            getattr(metric, kind).data_points.append(metrics_pb2.NumberDataPoint(
                time_unix_nano=ts, start_time_unix_nano=start, as_double=1.0))
            shape_ok = True
        time_ok = ts > 0 and abs(offset) < 3600 and start <= ts
        expected_bad += not (time_ok and shape_ok)
    out = _decode(METRICS, request)
    assert out.rejected == expected_bad
    assert out.rows == len(points) - expected_bad
    assert METRICS.response_for(out).partial_success.rejected_data_points == expected_bad
