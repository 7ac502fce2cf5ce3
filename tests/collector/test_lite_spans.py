"""The attribute-bytes view of span decoding reads exactly what the real OTLP schema reads."""

from __future__ import annotations

import json
import time
import uuid

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from fleetlens.collector.decode_common import Limits, any_value
from fleetlens.collector.decode_spans import decode_spans
from fleetlens.collector.lite_spans import LiteRequest, read_header, varint
from fleetlens.collector.name_budget import NameLimiter
from fleetlens.collector.signals import SPANS
from fleetlens.collector.testing import kvs, trace_request, vllm_span
from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema import columns as c


def _limits() -> Limits:
    return Limits(now_ns=time.time_ns(), skew_ns=3600 * 10**9, max_attributes=128,
                  max_value_bytes=8192)


def _request_with_raw_attribute(kv_bytes: bytes) -> bytes:
    """A one-span request whose only attribute is encoded as ``kv_bytes`` (hand-made)."""
    now = time.time_ns()
    span = trace_pb2.Span(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="s",
                          start_time_unix_nano=now, end_time_unix_nano=now + 1)
    spans = span.SerializeToString() + b"\x4a" + bytes([len(kv_bytes)]) + kv_bytes
    scope = b"\x12" + bytes([len(spans)]) + spans
    resource = b"\x12" + bytes([len(scope)]) + scope
    return b"\x0a" + bytes([len(resource)]) + resource


def _expected(keyvalues) -> tuple[dict, dict]:
    """Reference: every KeyValue read through upb with the generic conversion and the rule of
    docs/collector.md (a promoted key goes to its column when the value fits its type)."""
    attrs, columns = {}, {}
    for kv in keyvalues:
        value = any_value(kv.value, _limits())
        column, dtype = a.PROMOTED_SPAN_ATTRIBUTES.get(kv.key, (None, None))
        fits = column is not None and not isinstance(value, bool) and (
            isinstance(value, str) if dtype == pl.String() else
            isinstance(value, (int, float)) if dtype == pl.Float64() else isinstance(value, int))
        if fits:
            columns[column] = float(value) if dtype == pl.Float64() else value
        else:
            attrs[kv.key] = value
    return attrs, columns


def _check(out, keyvalues) -> None:
    expected_attrs, expected_columns = _expected(keyvalues)
    assert out.rows == 1
    assert out.columns[c.ATTRIBUTES][0] == json.dumps(
        expected_attrs, separators=(",", ":"), ensure_ascii=False)
    for column, _ in a.PROMOTED_SPAN_ATTRIBUTES.values():
        assert out.columns[column][0] == expected_columns.get(column)


# Encodings a protobuf writer may legally produce that are not the plain key-then-scalar shape.
ODD_KEYVALUES = [
    b"\x12\x09\x21" + bytes(8) + b"\x0a\x01k",  # value before key
    b"\x0a\x01k\x12\x02\x18\x05\x0a\x01j",  # key given twice: the last wins
    b"\x0a\x01k\x12\x04\x18\x05\x18\x07",  # int given twice
    b"\x0a\x01k\x12\x05\x0a\x01a\x18\x07",  # string then int in the oneof: int wins
    b"\x0a\x01k\x12\x02\x10\x02",  # bool encoded as 2
    b"\x0a\x01k\x12\x0b\x18" + b"\xff" * 9 + b"\x01",  # 10-byte varint (-1)
    b"\x0a\x01k\x12\x03\x18\x80\x01",  # two-byte varint (128)
    b"\x0a\x01k\x12\x00",  # empty AnyValue
    b"",  # empty KeyValue
    # NaN under a string-typed promoted key: any_value gives "NaN", which fits the column
    b"\x0a\x11" + a.GEN_AI_REQUEST_ID.encode() + b"\x12\x09\x21" + bytes.fromhex("f87f")[::-1]
    .rjust(8, b"\x00"),
]


@pytest.mark.parametrize("kv_bytes", ODD_KEYVALUES)
def test_odd_encodings_match_the_real_schema(kv_bytes: bytes) -> None:
    payload = _request_with_raw_attribute(kv_bytes)
    request = SPANS.request.FromString(payload)
    out = decode_spans(request, _limits(), NameLimiter(10), 1, payload)
    _check(out, [common_pb2.KeyValue.FromString(kv_bytes)])


scalars = st.one_of(
    st.text(max_size=300), st.booleans(), st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from([*a.PROMOTED_SPAN_ATTRIBUTES, "x", "é", "k" * 140]),
                       scalars, max_size=12))
def test_bytes_view_equals_decoding_the_real_messages(attrs: dict) -> None:
    span = vllm_span()
    del span.attributes[:]
    span.attributes.extend(kvs(attrs))
    request = trace_request([span])
    payload = request.SerializeToString()
    out = decode_spans(request, _limits(), NameLimiter(10), 1, payload)
    _check(out, request.resource_spans[0].scope_spans[0].spans[0].attributes)


def test_helpers_reject_other_shapes() -> None:
    assert read_header(b"\x0a\x01k\x12\x09\x21" + bytes(8)) == ("k", 0x21, 6, 14)
    assert read_header(b"\x0a\x01k\x12\x02\x18") is None  # truncated value
    assert read_header(b"\x0a\x01k\x12\x02\x28\x01") is None  # unknown tag
    assert varint(b"\x18\x80\x01", 1) == 128
    assert varint(b"\x18\x05\x00", 1) is None  # ends before the end
    assert LiteRequest.FromString(b"").resource_spans == []


def test_repeated_attributes_reuse_their_json_with_exact_counts() -> None:
    attrs = {"x": 1, "y": "y" * 50, "z": 2.5, "w": True, "v": "é"}
    spans = [vllm_span() for _ in range(3)]
    for span in spans:
        del span.attributes[:]
        span.attributes.extend(kvs(attrs))
    request = trace_request(spans)
    limits = Limits(now_ns=time.time_ns(), skew_ns=3600 * 10**9, max_attributes=2,
                    max_value_bytes=20)
    out = decode_spans(request, limits, NameLimiter(10), 1, request.SerializeToString())
    assert out.columns[c.ATTRIBUTES] == ['{"x":1,"y":"' + "y" * 20 + '"}'] * 3
    assert out.columns[c.DROPPED_ATTRIBUTES_COUNT] == [3] * 3
    assert out.truncated == 3 * (3 + 1)  # per span: 3 dropped attributes, 1 cut string


def test_json_cache_skips_large_attribute_sets() -> None:
    from fleetlens.collector import decode_spans as module

    span = vllm_span()
    span.attributes.extend(kvs({f"extra.{i}": "v" * 100 for i in range(20)}))  # > 1 KiB
    request = trace_request([span])
    before = dict(module._JSON_CACHE)
    out = decode_spans(request, _limits(), NameLimiter(10), 1, request.SerializeToString())
    assert len(json.loads(out.columns[c.ATTRIBUTES][0])) == 20 + 4  # + vLLM's 4 non-promoted
    assert module._JSON_CACHE.keys() - before.keys() == set()
    fresh = vllm_span()  # the positive control: a small set (not seen before) is cached
    fresh.attributes.extend(kvs({"extra.id": uuid.uuid4().hex}))
    small = trace_request([fresh])
    decode_spans(small, _limits(), NameLimiter(10), 1, small.SerializeToString())
    assert len(module._JSON_CACHE.keys() - before.keys()) == 1
