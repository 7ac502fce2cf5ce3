"""R7: hostile input against the real server (Hypothesis). Only the documented codes come
back (OK with an exact partial success, or INVALID_ARGUMENT / HTTP 400), the server never
crashes or hangs, and exactly the accepted spans are stored.

Example counts keep `make test` fast; ``FLEETLENS_HOSTILE_EXAMPLES=5000`` runs thousands.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.trace.v1 import trace_pb2

from fleetlens.collector.signals import SPANS
from fleetlens.collector.testing import any_value, kvs, running_collector, trace_request
from fleetlens.pipeline.storage import DataDir, scan

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
EXAMPLES = int(os.environ.get("FLEETLENS_HOSTILE_EXAMPLES", "250"))
SKEW_S = 3600
CONFIG = {"max_clock_skew_s": float(SKEW_S), "max_future_skew_s": float(SKEW_S),
          "max_attribute_value_bytes": 4096, "max_attributes": 32}
NS = 10**9
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                    suppress_health_check=list(HealthCheck))

_sizes = st.sampled_from([16, 8, 16, 8, 0, 3, 20])
ids = st.one_of(_sizes.flatmap(lambda n: st.binary(min_size=n, max_size=n)),
                st.sampled_from([b"\x07" * 16, b"\x09" * 8]))
#: Offsets from now in seconds: clearly inside or clearly outside the skew (never at the edge).
offsets = st.one_of(st.integers(-SKEW_S + 60, SKEW_S - 60), st.integers(-SKEW_S + 60, 0),
                    st.integers(SKEW_S + 60, 10**9),
                    st.integers(-(10**9), -SKEW_S - 60), st.just(None))
scalars = st.one_of(st.text(max_size=30), st.integers(-(2**63), 2**63 - 1), st.floats(),
                    st.booleans(), st.binary(max_size=20),
                    st.integers(0, 20_000).map(lambda n: "é" * n))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)


def _nest(value, depth: int):
    for _ in range(depth):
        value = [value]
    return value


def _containers(value) -> int:
    """Deepest nesting of lists/dicts (the collector rejects 17 or more)."""
    if isinstance(value, list):
        return 1 + max((_containers(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_containers(v) for v in value.values()), default=0)
    return 0


def _valid_id(raw: bytes, size: int, optional: bool = False) -> bool:
    return (optional and not raw) or (len(raw) == size and any(raw))


@st.composite
def hostile_span(draw):
    now = time.time_ns()
    # Half the spans are well-formed apart from their attribute values, so both outcomes
    # (accepted and rejected) are exercised often.
    tame = draw(st.booleans())
    start_offset = draw(st.integers(-SKEW_S + 60, 0) if tame else offsets)
    duration = draw(st.integers(0, 5) if tame else st.integers(-5, 5))
    start = 0 if start_offset is None else max(0, now + start_offset * NS)
    end = max(0, start + duration * NS)
    attrs = draw(st.dictionaries(st.text(max_size=10), values, max_size=40))
    deep = draw(st.integers(0, 16 if tame else 30))
    if deep:
        attrs["deep"] = _nest("x", deep)
    if tame:
        trace_id, span_id = draw(st.binary(min_size=16, max_size=16)), b"\x05" * 8
        trace_id = trace_id if any(trace_id) else b"\x01" * 16
    else:
        trace_id, span_id = draw(ids), draw(ids)
    parent = draw(st.sampled_from([b"", bytes(8), b"\x01" * 8, b"\x02" * 3]))
    parent = b"" if tame else parent
    link = None if tame else draw(st.one_of(st.none(), st.tuples(ids, ids)))
    span = trace_pb2.Span(trace_id=trace_id, span_id=span_id, parent_span_id=parent,
                          name=draw(st.text(max_size=50)), kind=draw(st.integers(0, 5)),
                          start_time_unix_nano=start, end_time_unix_nano=end,
                          attributes=kvs(attrs))
    if link:
        span.links.add(trace_id=link[0], span_id=link[1])
    valid = (_valid_id(trace_id, 16) and _valid_id(span_id, 8)
             and _valid_id(parent, 8, optional=True)
             and start > 0 and end > 0 and end >= start
             and abs(start - now) < SKEW_S * NS and abs(end - now) < SKEW_S * NS
             and all(_containers(v) < 17 for v in attrs.values())
             and (link is None or (_valid_id(link[0], 16) and _valid_id(link[1], 8))))
    return span, valid


def test_hostile_spans_get_exact_partial_success_and_exact_storage(tmp_path) -> None:
    data = tmp_path / "data"
    accepted = 0
    with running_collector(data, config=CONFIG) as col:

        @SETTINGS
        @given(spans=st.lists(hostile_span(), max_size=8), bad_resource=st.booleans())
        def structured(spans, bad_resource) -> None:
            nonlocal accepted
            request = trace_request([s for s, _ in spans])
            if bad_resource:  # a resource nested too deep rejects all of its spans
                request.resource_spans[0].resource.attributes.add(
                    key="r", value=any_value(_nest(1, 20)))
            expected_rejected = len(spans) if bad_resource else sum(
                1 for _, ok in spans if not ok)
            response = col.export(request, timeout=30)
            assert response.partial_success.rejected_spans == expected_rejected
            assert bool(response.partial_success.error_message) == bool(expected_rejected)
            accepted += len(spans) - expected_rejected

        structured()
        assert col.stop() == 0
    assert accepted > 0
    assert scan(DataDir(data), "spans").collect().height == accepted


JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=20)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(
        st.sampled_from(["resourceSpans", "scopeSpans", "spans", "traceId", "spanId",
                         "attributes", "x", "name"]), inner, max_size=4)),
    max_leaves=15)


def test_garbage_and_hostile_json_get_only_documented_codes(tmp_path) -> None:
    with running_collector(tmp_path / "data", config=CONFIG) as col:

        @SETTINGS
        @given(payload=st.binary(max_size=400))
        def garbage(payload) -> None:
            try:
                col.export_bytes(SPANS, payload, timeout=30)
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error

        @settings(SETTINGS, max_examples=max(50, EXAMPLES // 3))
        @given(doc=JSON_VALUES)
        def hostile_json(doc) -> None:
            req = urllib.request.Request(
                f"{col.http_url}{SPANS.http_path}", data=json.dumps(doc).encode(),
                headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=30) as resp:
                    status = resp.status
            except urllib.error.HTTPError as err:
                status = err.code
                err.close()
            assert status in (200, 400)

        garbage()
        hostile_json()
        # Invalid UTF-8 inside a string field: INVALID_ARGUMENT for the whole request.
        raw = trace_request([trace_pb2.Span(name="MARKER")]).SerializeToString()
        with pytest.raises(grpc.RpcError) as info:
            col.export_bytes(SPANS, raw.replace(b"MARKER", b"\xff\xfe\xc0\x80ab"))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # Still alive and serving after all of it.
        assert col.export(trace_request([])).partial_success.rejected_spans == 0
        assert col.stop() == 0
