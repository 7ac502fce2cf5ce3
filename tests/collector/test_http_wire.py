"""OTLP/HTTP framing against a real collector on 127.0.0.1, over raw sockets: a body that ends
early, Content-Length that is not plain digits, Transfer-Encoding with Content-Length,
multi-member gzip, bytes after the gzip body, chunked bodies, media types in any case.

Every case sends its spans under its own service name; at the end the stored rows per
service must be exactly what each case was acknowledged for (nothing for a refusal).
"""

from __future__ import annotations

import gzip
import socket
import urllib.request
from collections import Counter

import pytest
from opentelemetry.proto.trace.v1 import trace_pb2

from fleetlens.collector.otlp_json import to_json
from fleetlens.collector.signals import SPANS
from fleetlens.collector.testing import resource, running_collector, vllm_span
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.storage import DataDir, scan

pytestmark = pytest.mark.e2e
PROTOBUF = "application/x-protobuf"


def six_resources(service: str) -> tuple[bytes, bytes]:
    """A 6-span request as two halves of 3 ResourceSpans each: each half, and the two
    concatenated, are valid requests (repeated fields concatenate)."""
    halves = []
    for half in range(2):
        request = SPANS.request(resource_spans=[
            trace_pb2.ResourceSpans(resource=resource(service, f"h{half}{i}"),
                                    scope_spans=[trace_pb2.ScopeSpans(spans=[vllm_span()])])
            for i in range(3)])
        halves.append(request.SerializeToString())
    return halves[0], halves[1]


def post(address: str, body: bytes, headers: dict[str, str] | None = None,
         head: bytes | None = None) -> tuple[int, bytes]:
    """Send one raw request, half-close, read the whole answer: (status, raw response)."""
    host, _, port = address.rpartition(":")
    lines = [f"POST {SPANS.http_path} HTTP/1.1", f"Host: {address}"]
    headers = dict(headers or {})
    if "Content-Length" not in headers and "Transfer-Encoding" not in headers:
        headers["Content-Length"] = str(len(body))
    lines += [f"{k}: {v}" for k, v in headers.items()]
    raw = head if head is not None else ("\r\n".join(lines) + "\r\n\r\n").encode()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(raw + body)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1."), answer[:200]
    return int(answer.split(b" ", 2)[1]), answer


def chunked(body: bytes, size: int = 100) -> bytes:
    parts = [body[i:i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


#: Spans each service's requests were acknowledged for, checked against Parquet at the end.
ACKED: Counter[str] = Counter()


@pytest.fixture(scope="module")
def col(tmp_path_factory):
    with running_collector(tmp_path_factory.mktemp("wire") / "data") as running:
        yield running


def received(col) -> float:
    with urllib.request.urlopen(f"{col.http_url}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    return float(next(line.split()[1] for line in text.splitlines()
                      if line.startswith("fleetlens_collector_received_spans_total ")))


def case(col, service: str, status: int, stored: int, body: bytes,
         headers: dict[str, str]) -> bytes:
    """Post ``body``; check the status and how many spans were made durable."""
    before = received(col)
    got, answer = post(col.http_address, body, headers)
    assert got == status, (service, answer[:300])
    assert received(col) - before == stored, service
    ACKED[service] += stored
    return answer


def test_a_body_shorter_than_its_content_length_is_refused(col) -> None:
    # http.server read to EOF, stored the first 3 of 6 spans and answered 200.
    first, second = six_resources("short")
    case(col, "short", 400, 0, first, {"Content-Type": PROTOBUF,
                                       "Content-Length": str(len(first + second))})


def test_every_gzip_member_is_read(col) -> None:
    # http.server inflated the first member only: 3 of 6 spans stored, answered 200.
    first, second = six_resources("members")
    case(col, "members", 200, 6, gzip.compress(first) + gzip.compress(second),
         {"Content-Type": PROTOBUF, "Content-Encoding": "gzip"})


def test_bytes_after_the_gzip_body_are_refused(col) -> None:
    first, second = six_resources("garbage")
    case(col, "garbage", 400, 0, gzip.compress(first + second) + b"garbage!",
         {"Content-Type": PROTOBUF, "Content-Encoding": "gzip"})


@pytest.mark.parametrize("bad", ["+{n}", "1_{n}", "-1", "0x{n}", "{n} {n}", "{n}, {m}"])
def test_content_length_must_be_plain_digits(col, bad) -> None:
    # Python's int(), which http.server used, takes "+N", "1_N" and "-1".
    first, second = six_resources("length")
    body = first + second
    case(col, "length", 400, 0, body, {"Content-Type": PROTOBUF,
                                       "Content-Length": bad.format(n=len(body), m=len(first))})


def test_transfer_encoding_with_content_length_is_refused(col) -> None:
    # Both framings at once is how request smuggling starts; http.server used the length.
    first, second = six_resources("te-cl")
    body = first + second
    case(col, "te-cl", 400, 0, chunked(body), {"Content-Type": PROTOBUF,
                                                "Content-Length": str(len(body)),
                                                "Transfer-Encoding": "chunked"})


def test_a_chunked_body_is_accepted(col) -> None:
    # http.server answered 411.
    first, second = six_resources("chunked")
    case(col, "chunked", 200, 6, chunked(first + second),
         {"Content-Type": PROTOBUF, "Transfer-Encoding": "chunked"})


def test_media_types_match_in_any_case(col) -> None:
    # http.server answered 415 to both.
    first, second = six_resources("case")
    case(col, "case", 200, 6, first + second, {"Content-Type": "Application/X-Protobuf"})
    first, second = six_resources("json")
    text = to_json(SPANS.request.FromString(first + second)).encode()
    answer = case(col, "json", 200, 6, text,
                  {"Content-Type": "APPLICATION/JSON; charset=utf-8"})
    assert b"content-type: application/json" in answer.lower(), answer[:300]


def test_what_was_acknowledged_is_exactly_what_is_stored(col) -> None:
    first, second = six_resources("plain")
    case(col, "plain", 200, 6, first + second, {"Content-Type": PROTOBUF})
    assert col.stop() == 0
    stored = Counter(scan(DataDir(col.data_dir), "spans").select(c.SERVICE_NAME).collect()
                     [c.SERVICE_NAME].to_list())
    assert stored == +ACKED


def test_pipelined_keep_alive_requests_are_all_answered_in_order(tmp_path) -> None:
    with running_collector(tmp_path / "data") as col:
        host, _, port = col.http_address.rpartition(":")
        first, second = six_resources("pipelined")
        one = (f"POST {SPANS.http_path} HTTP/1.1\r\nHost: x\r\nContent-Type: {PROTOBUF}\r\n"
               f"Content-Length: {len(first)}\r\n\r\n").encode() + first
        health = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(one + health + one)
            sock.shutdown(socket.SHUT_WR)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        assert answer.count(b"HTTP/1.1 200 ") == 3, answer
        assert col.stop() == 0
    assert scan(DataDir(tmp_path / "data"), "spans").collect().height == 6
