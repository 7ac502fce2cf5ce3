"""The compiled span kernel decodes exactly as the Python decoder (its reference) does.

Differential: every request goes through ``decode_spans`` with the kernel and with Python
alone (``tests/collector/fuzz_targets.differential_outcomes``): the same columns, counts,
rejection messages, truncation count, unknown-field flag and name budgets, or the same
refusal. Inputs: the fuzz corpus, mutated vLLM requests, and generated hostile requests
(bad ids and times, every attribute shape, limits reached, unknown fields, non-canonical
encodings, events and links).
"""

from __future__ import annotations

import os
import random
import struct
import subprocess
import sys
from dataclasses import replace
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from fleetlens.collector import span_kernel
from fleetlens.collector.decode_common import OVERFLOW_NAME
from fleetlens.collector.testing import any_value, trace_request, vllm_span, vllm_trace_request
from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from tests.collector.fuzz_targets import (
    CONFIG,
    CORPUS,
    RECEIVED_NS,
    corpus,
    differential_outcomes,
)
from tests.collector.test_fuzz import NAMES, _all_inputs, _mutate

#: Small limits (truncation, attribute counts) and the collector's defaults.
TIGHT = replace(CONFIG, max_attributes=4, max_attribute_value_bytes=12, max_name_bytes=8,
                max_attribute_key_bytes=8)
SEED_NS = RECEIVED_NS - 10**9
PROMOTED = list(a.PROMOTED_SPAN_ATTRIBUTE_DTYPES)
needs_kernel = pytest.mark.skipif(
    span_kernel.KERNEL is None, reason=f"the span kernel is not built or {span_kernel.ENV}=0")


@needs_kernel
def test_the_kernel_takes_a_vllm_request_and_matches_python() -> None:
    payload = vllm_trace_request(64, seed=1, start_ns=SEED_NS).SerializeToString()
    out = differential_outcomes(CONFIG, payload)
    assert out is not None and out[1] == 64  # all accepted
    plan = span_kernel.KERNEL.walk(payload)
    assert plan is not None  # the kernel's path, not the whole-request fallback
    scope = plan[0][2][0]
    _, fallbacks, _, _ = span_kernel.KERNEL.decode_scope(
        payload, scope[2], scope[3], 0, 2**62, 8192, 1024, lambda *x: ("{}", 0, 0),
        SimpleNamespace(truncated=0))
    assert fallbacks == []  # every vLLM span decoded in C


@needs_kernel
def test_model_names_past_the_budget_are_stored_as_overflow() -> None:
    # admit_model replaces values after decoding: the stored table must show it.
    spans = [vllm_span(random.Random(i), start_ns=SEED_NS) for i in range(4)]
    for i, span in enumerate(spans):
        for kv in span.attributes:
            if kv.key == a.GEN_AI_REQUEST_MODEL:
                kv.value.string_value = f"model-{i % 3}"
    config = replace(CONFIG, max_new_names_per_request=1)  # models have a budget apart
    out = differential_outcomes(config, trace_request(spans).SerializeToString())
    assert out is not None
    assert out[0][c.GEN_AI_REQUEST_MODEL] == ["model-0", OVERFLOW_NAME, OVERFLOW_NAME, "model-0"]


@needs_kernel
@pytest.mark.parametrize("name", ["spans_pb", "all", "spans_kernel"])
def test_the_fuzz_corpus_decodes_the_same(name) -> None:
    if name == "all":  # findings of bench/fuzz.py --target all for spans_pb
        inputs = [d[1:] for _, d in _all_inputs() if d and d[0] % (len(NAMES) + 1) == 0]
    elif (CORPUS / name).is_dir():  # spans_kernel: findings of bench/fuzz_span_kernel.py
        inputs = [d for _, d in corpus(name)]
    else:
        pytest.skip(f"no {name} corpus yet")
    for data in inputs:
        for config in (CONFIG, TIGHT):
            try:
                differential_outcomes(config, data)
            except Exception as exc:  # noqa: BLE001 - an unparsable input is not compared
                assert "DecodeError" in type(exc).__name__, exc


@needs_kernel
@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 100), edits=st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 10**6), st.integers(0, 255)), max_size=4))
def test_mutated_vllm_requests_decode_the_same(seed, edits) -> None:
    data = _mutate(vllm_trace_request(3, seed=seed, start_ns=SEED_NS).SerializeToString(),
                   edits)
    try:
        trace_pb2.TracesData.FromString(data)  # same wire format as the request
    except Exception:  # noqa: BLE001 - the real parse refuses it: never decoded
        return
    differential_outcomes(TIGHT if seed % 2 else CONFIG, data)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes([*out, value])


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (number < 16)."""
    return bytes([number << 3 | 2]) + _varint(len(payload)) + payload


#: Ids: mostly valid (the kernel's path), sometimes empty, zero or of the wrong size.
_BAD_IDS = [b"", bytes(8), bytes(16), b"\x01" * 7]
_TEXTS = ["", "llama-3-8b", "é" * 7, "x" * 40, "ab\u2028\"\\", "日本語テキスト", "x" * 9]
_KEYS = [*PROMOTED, "n", "gen_ai.request.temperature", "k" * 20, "", "ü"]
#: Non-canonical or unknown encodings appended to a span (upb reads them; they set flags).
_TAILS = [b"\x98\x06\x01",  # unknown field 99
          b"\x30\x00",  # kind 0 written out
          b"\x2a\x01z",  # name twice: the last one wins
          b"\x4a\x00",  # an empty KeyValue
          b"\x4a\x09\x0a\x01n\x12\x02\x18\x01\x18\x00",  # a KeyValue with an unknown field
          b"\x4a\x08\x0a\x01n\x12\x03\x18\x80\x00",  # an overlong int varint
          b"\x2a\x00",  # an empty name written out
          # a promoted int whose AnyValue then sets bool_value too (the oneof's last wins)
          _field(9, _field(1, a.GEN_AI_PROMPT_TOKENS.encode()) + _field(2, b"\x18\x01\x10\x01"))]
#: A status with its message written out empty (non-canonical), for spans without one.
_EMPTY_MESSAGE = b"\x7a\x02\x12\x00"
_SKEW_NS = int(CONFIG.max_clock_skew_s * 1e9)
#: Time bounds exactly, and one past each (TIGHT has the same skew).
_EDGES = [RECEIVED_NS - _SKEW_NS, RECEIVED_NS - _SKEW_NS - 1, RECEIVED_NS + _SKEW_NS,
          RECEIVED_NS + _SKEW_NS + 1]


def _value(rng: random.Random) -> object:
    """Mostly scalars (the kernel's plain shape), else what only Python decodes."""
    kind = rng.randrange(16)
    if kind < 15:
        return rng.choice([
            True, False, 0, 1, 300, -5, 2**63 - 1, -2**63, rng.randrange(2**40), 0.5, -0.0,
            float("nan"), float("inf"), 1e300, rng.random(), rng.choice(_TEXTS),
            "y" * rng.randrange(120, 140)])
    return rng.choice([None, b"\x00\x01", [1, "a"], {"a": 1}, "z" * 300])


def _span(rng: random.Random) -> bytes:
    """One span, valid with a fair chance, hostile in one or more ways otherwise."""
    def pick(good, bad):  # the good value nine times in ten
        return good if rng.random() < 0.9 else rng.choice(bad)

    start = pick(SEED_NS, [0, 1, RECEIVED_NS + 10**18, *_EDGES])
    span = trace_pb2.Span(
        trace_id=pick(rng.randbytes(16), _BAD_IDS), span_id=pick(rng.randbytes(8), _BAD_IDS),
        parent_span_id=pick(rng.choice([b"", rng.randbytes(8)]), _BAD_IDS),
        name=rng.choice(_TEXTS), trace_state=rng.choice(_TEXTS), kind=rng.randrange(7),
        flags=rng.choice([0, 1, 2**32 - 1]), start_time_unix_nano=start,
        end_time_unix_nano=pick(start + 5, [start, start - 1 if start else 0, *_EDGES]),
        attributes=[_attribute(rng) for _ in range(rng.randrange(7))],
        dropped_attributes_count=rng.choice([0, 0, 3]),
        dropped_events_count=rng.choice([0, 0, 2]), dropped_links_count=rng.choice([0, 0, 1]))
    if rng.random() < 0.8:
        span.status.code, span.status.message = rng.randrange(3), rng.choice(_TEXTS)
    if rng.random() < 0.1:
        span.events.add(time_unix_nano=SEED_NS, name="e")
    if rng.random() < 0.1:
        span.links.add(trace_id=b"\x01" * 16, span_id=b"\x01" * 8)
    tails = _TAILS if span.HasField("status") else [*_TAILS, _EMPTY_MESSAGE]
    return span.SerializeToString() + (rng.choice(tails) if rng.random() < 0.1 else b"")


def _attribute(rng: random.Random) -> common_pb2.KeyValue:
    """A random key; a promoted key gets a value of its column's type two times in three."""
    key = rng.choice(_KEYS)
    dtype = a.PROMOTED_SPAN_ATTRIBUTE_DTYPES.get(key, (None, None))[1]
    if dtype is None or rng.random() < 0.33:
        return _kv(key, _value(rng))
    if dtype == t.STR:
        return _kv(key, rng.choice(_TEXTS))
    if dtype == t.F64:
        return _kv(key, rng.choice([rng.random(), rng.randrange(-5, 2**20), 2**53 + 1]))
    return _kv(key, rng.choice([0, rng.randrange(2**14), rng.randrange(-2**63, 2**63)]))


def _kv(key: str, value) -> common_pb2.KeyValue:
    return common_pb2.KeyValue(key=key) if value is None else \
        common_pb2.KeyValue(key=key, value=any_value(value))


def _request(rng: random.Random) -> bytes:
    """Two scopes under one resource (sometimes invalid: its scopes are rejected whole)."""
    deep: object = 1
    for _ in range(20):
        deep = [deep]
    request = trace_request([], **({"deep": deep} if rng.random() < 0.1 else {}))
    spans = [_span(rng) for _ in range(rng.randrange(1, 7))]
    split = rng.randrange(len(spans) + 1)
    first = request.resource_spans[0].scope_spans[0].SerializeToString() + b"".join(
        b"\x12" + _varint(len(s)) + s for s in spans[:split])
    second = trace_pb2.ScopeSpans(scope=common_pb2.InstrumentationScope(name="b" * 30))
    second_raw = second.SerializeToString() + b"".join(
        b"\x12" + _varint(len(s)) + s for s in spans[split:])
    resource = request.resource_spans[0].resource.SerializeToString()
    body = (b"\x0a" + _varint(len(resource)) + resource + b"\x12" + _varint(len(first))
            + first + b"\x12" + _varint(len(second_raw)) + second_raw)
    return b"\x0a" + _varint(len(body)) + body


@needs_kernel
@pytest.mark.parametrize("seed", range(4))
def test_hostile_requests_decode_the_same(seed) -> None:
    rng = random.Random(seed)
    for i in range(300):
        differential_outcomes(TIGHT if i % 2 else CONFIG, _request(rng))


@needs_kernel
def test_garbage_never_crashes_the_kernel() -> None:
    kernel = span_kernel.KERNEL
    for data in (b"", b"\x0a", b"\x0a\xff\xff\xff\xff\x0f", b"\x0a\x02\x12\x00", b"\xff" * 9,
                 struct.pack("<Q", 2**64 - 1), b"\x0a\x04\x12\x02\x12\x00"):
        plan = kernel.walk(data)
        for _, _, scopes in plan or ():
            for _, _, offset, length, _ in scopes:
                kernel.decode_scope(data, offset, length, 0, 2**62, 4, 4,
                                    lambda *x: ("{}", 0, 0), SimpleNamespace(truncated=0))
    with pytest.raises(ValueError):
        kernel.decode_scope(b"\x00", 0, 5, 0, 1, 1, 1, lambda *x: None, None)


def test_the_environment_variable_forces_the_python_path() -> None:
    code = "from fleetlens.collector import span_kernel as k; print(k.KERNEL is None)"
    for value, expected in (("0", "True"), ("off", "True")):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env={**os.environ, span_kernel.ENV: value}, check=True)
        assert done.stdout.strip() == expected
