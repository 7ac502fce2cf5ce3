"""The OTLP specification examples, as JSON over HTTP and re-encoded as protobuf over gRPC:
stored rows equal the input field by field (ids, times, attributes, events, resource, scope).

Expected rows are computed here from the JSON with an independent, minimal OTLP/JSON reader.
"""

from __future__ import annotations

import base64
import json
import urllib.request

import pytest
from google.protobuf import json_format

from fleetlens.collector.otlp_json import ID_KEYS
from fleetlens.collector.signals import LOGS, METRICS, SPANS
from fleetlens.collector.testing import running_collector
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.storage import DataDir, scan
from tests.conftest import shared_file

pytestmark = pytest.mark.e2e
EXAMPLES = ("data", "otlp_examples")
#: The examples are from 2018: accept timestamps up to 20 years from now.
CONFIG = {"max_clock_skew_s": 20 * 365 * 86400.0, "flush_interval_s": 0.2}


def _value(v: dict):
    (kind, raw), = v.items() if v else ((None, None),)
    if kind == "intValue":
        return int(raw)
    if kind == "arrayValue":
        return [_value(x) for x in raw.get("values", [])]
    if kind == "kvlistValue":
        return _attrs(raw.get("values", []))
    return raw  # stringValue, boolValue, doubleValue


def _attrs(kvs: list) -> dict:
    return {kv["key"]: _value(kv["value"]) for kv in kvs}


def _expected_spans(doc: dict) -> list[dict]:
    rows = []
    for rs in doc["resourceSpans"]:
        res = _attrs(rs["resource"]["attributes"])
        for ss in rs["scopeSpans"]:
            scope = ss["scope"]
            for s in ss["spans"]:
                rows.append({
                    c.TRACE_ID: s["traceId"].lower(), c.SPAN_ID: s["spanId"].lower(),
                    c.PARENT_SPAN_ID: s.get("parentSpanId", "").lower(), c.NAME: s["name"],
                    c.KIND: s["kind"], c.START_NS: int(s["startTimeUnixNano"]),
                    c.END_NS: int(s["endTimeUnixNano"]), c.ATTRIBUTES: _attrs(s["attributes"]),
                    c.EVENTS: [], c.LINKS: [], c.SERVICE_NAME: res["service.name"],
                    c.HOST_NAME: "", c.RESOURCE_ATTRIBUTES: res, c.SCOPE_NAME: scope["name"],
                    c.SCOPE_VERSION: scope["version"],
                    c.SCOPE_ATTRIBUTES: _attrs(scope["attributes"]),
                    c.STATUS_CODE: 0, c.STATUS_MESSAGE: "",
                })
    return rows


def _expected_points(doc: dict) -> list[dict]:
    rows = []
    for rm in doc["resourceMetrics"]:
        res = _attrs(rm["resource"]["attributes"])
        for sm in rm["scopeMetrics"]:
            for m in sm["metrics"]:
                kind = next(k for k in ("gauge", "sum", "histogram", "exponentialHistogram",
                                        "summary") if k in m)
                for p in m[kind]["dataPoints"]:
                    row = {c.METRIC_NAME: m["name"], c.UNIT: m["unit"],
                           c.DESCRIPTION: m["description"], c.TS_NS: int(p["timeUnixNano"]),
                           c.START_NS: int(p.get("startTimeUnixNano", 0)),
                           c.ATTRIBUTES: _attrs(p["attributes"]),
                           c.RESOURCE_ATTRIBUTES: res, c.SERVICE_NAME: res["service.name"],
                           c.SCOPE_NAME: sm["scope"]["name"]}
                    if "asDouble" in p:
                        row[c.VALUE] = float(p["asDouble"])
                    if "count" in p:
                        row.update({c.COUNT: int(p["count"]), c.SUM: float(p["sum"]),
                                    c.MIN: float(p["min"]), c.MAX: float(p["max"])})
                    if "bucketCounts" in p:
                        row[c.BUCKET_COUNTS] = [int(x) for x in p["bucketCounts"]]
                        row[c.EXPLICIT_BOUNDS] = [float(x) for x in p["explicitBounds"]]
                    if "positive" in p:
                        row[c.EXP_ZERO_COUNT] = int(p["zeroCount"])
                        row[c.EXP_POSITIVE_OFFSET] = p["positive"]["offset"]
                        row[c.EXP_POSITIVE_BUCKET_COUNTS] = [
                            int(x) for x in p["positive"]["bucketCounts"]]
                    rows.append(row)
    return rows


def _expected_logs(doc: dict) -> list[dict]:
    rows = []
    for rl in doc["resourceLogs"]:
        res = _attrs(rl["resource"]["attributes"])
        for sl in rl["scopeLogs"]:
            for r in sl["logRecords"]:
                body = _value(r["body"])
                rows.append({
                    c.TS_NS: int(r["timeUnixNano"]), c.OBSERVED_NS: int(r["observedTimeUnixNano"]),
                    c.SEVERITY_NUMBER: r["severityNumber"], c.SEVERITY_TEXT: r["severityText"],
                    c.BODY: body if isinstance(body, str) else json.dumps(body),
                    c.EVENT_NAME: r.get("eventName", ""),
                    c.TRACE_ID: r.get("traceId", "").lower(),
                    c.SPAN_ID: r.get("spanId", "").lower(),
                    c.ATTRIBUTES: _attrs(r["attributes"]), c.RESOURCE_ATTRIBUTES: res,
                    c.SERVICE_NAME: res["service.name"], c.SCOPE_NAME: sl["scope"]["name"],
                })
    return rows


JSON_COLUMNS = {c.ATTRIBUTES, c.RESOURCE_ATTRIBUTES, c.SCOPE_ATTRIBUTES, c.EVENTS, c.LINKS}
CASES = [("trace.json", SPANS, _expected_spans), ("metrics.json", METRICS, _expected_points),
         ("logs.json", LOGS, _expected_logs), ("events.json", LOGS, _expected_logs)]


def _stored(data_dir, sig, expected: list[dict]) -> list[dict]:
    """The stored rows, each cut to the keys of its expected row, JSON columns parsed."""
    frame = scan(DataDir(data_dir), sig.table.name).collect()
    rows = []
    for row, want in zip(frame.iter_rows(named=True), expected, strict=True):
        picked = {}
        for key in want:
            value = row[key]
            if key in JSON_COLUMNS:
                value = json.loads(value)
            elif key == c.BODY and isinstance(value, str) and value.startswith("{"):
                value = json.dumps(json.loads(value))
            picked[key] = value
        rows.append(picked)
    return rows


def _proto_from_json(sig, text: str):
    doc = json.loads(text)

    def to_b64(node):
        if isinstance(node, dict):
            for k, v in node.items():
                if k in ID_KEYS:
                    node[k] = base64.b64encode(bytes.fromhex(v)).decode()
                else:
                    to_b64(v)
        elif isinstance(node, list):
            for x in node:
                to_b64(x)
        return node
    return json_format.ParseDict(to_b64(doc), sig.request())


@pytest.mark.parametrize("name,sig,expect", CASES, ids=[case[0] for case in CASES])
def test_spec_example_round_trips_over_http_json_and_grpc_protobuf(
        tmp_path, name, sig, expect) -> None:
    text = shared_file(*EXAMPLES, name).read_text()
    expected = expect(json.loads(text))
    assert expected
    http_dir, grpc_dir = tmp_path / "http", tmp_path / "grpc"
    with running_collector(http_dir, config=CONFIG) as col:
        req = urllib.request.Request(f"{col.http_url}{sig.http_path}", data=text.encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.status == 200
            assert json.loads(resp.read()) == {}  # no partial success: all accepted
        col.stop()
    with running_collector(grpc_dir, config=CONFIG) as col:
        response = col.export(_proto_from_json(sig, text))
        assert not response.HasField("partial_success")
        col.stop()
    for data in (http_dir, grpc_dir):
        assert _stored(data, sig, expected) == expected
