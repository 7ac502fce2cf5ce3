"""The attribute-bytes view of span decoding reads exactly what the real OTLP schema reads."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from collector.decode_common import Limits, NameLimiter, any_value
from collector.decode_spans import decode_spans
from collector.lite_spans import LiteRequest, read_header, varint
from collector.signals import SPANS
from collector.testing import kvs, trace_request, vllm_span
from pipeline.schema import attributes as a
from pipeline.schema import columns as c


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
]


@pytest.mark.parametrize("kv_bytes", ODD_KEYVALUES)
def test_odd_encodings_match_the_real_schema(kv_bytes: bytes) -> None:
    payload = _request_with_raw_attribute(kv_bytes)
    request = SPANS.request.FromString(payload)
    kv = common_pb2.KeyValue.FromString(kv_bytes)
    expected = {kv.key: any_value(kv.value, _limits())}
    out = decode_spans(request, _limits(), NameLimiter(10), 1, payload)
    assert out.rows == 1
    assert json.loads(out.columns[c.ATTRIBUTES][0]) == expected


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
    with_payload = decode_spans(request, _limits(), NameLimiter(10), 1, payload)
    # Reference: every KeyValue read through upb with the generic conversion.
    reference = {}
    for kv in request.resource_spans[0].scope_spans[0].spans[0].attributes:
        reference[kv.key] = any_value(kv.value, _limits())
    stored = json.loads(with_payload.columns[c.ATTRIBUTES][0])
    for key, value in reference.items():
        column = a.PROMOTED_SPAN_ATTRIBUTES.get(key, (None,))[0]
        if column is not None and with_payload.columns[column][0] is not None:
            assert key not in stored
            stored_value = with_payload.columns[column][0]
            # an int in a float column is stored converted
            assert stored_value == (float(value) if isinstance(stored_value, float) else value)
        else:
            assert stored[key] == value or (value != value and stored[key] != stored[key])


def test_helpers_reject_other_shapes() -> None:
    assert read_header(b"\x0a\x01k\x12\x09\x21" + bytes(8)) == ("k", 0x21, 6, 14)
    assert read_header(b"\x0a\x01k\x12\x02\x18") is None  # truncated value
    assert read_header(b"\x0a\x01k\x12\x02\x28\x01") is None  # unknown tag
    assert varint(b"\x18\x80\x01", 1) == 128
    assert varint(b"\x18\x05\x00", 1) is None  # ends before the end
    assert LiteRequest.FromString(b"").resource_spans == []
