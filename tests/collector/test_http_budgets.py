"""OTLP/HTTP connections get their own budget of new service/host names, as gRPC ones do:
the HTTP receiver names the connection (its peer) to the ingest path."""

from __future__ import annotations

import http.client

import pytest

from fleetlens.collector.signals import SPANS
from fleetlens.collector.testing import running_collector
from fleetlens.pipeline.schema import columns as c
from tests.collector.test_budgets import _many_names, _spans

pytestmark = pytest.mark.e2e


def _post(conn: http.client.HTTPConnection, request) -> int:
    conn.request("POST", SPANS.http_path, body=request.SerializeToString(),
                 headers={"Content-Type": "application/x-protobuf"})
    response = conn.getresponse()
    response.read()
    return response.status


def test_each_http_connection_has_its_own_budget_of_new_names(tmp_path) -> None:
    data = tmp_path / "data"
    config = {"max_new_names_per_request": 10, "max_new_names_per_connection": 15}
    with running_collector(data, config=config) as col:
        host, _, port = col.http_address.rpartition(":")
        first = http.client.HTTPConnection(host, int(port), timeout=30)
        assert _post(first, _many_names(5, "a")) == 200  # 10 new names: all kept
        assert _post(first, _many_names(5, "b")) == 200  # same connection: 5 left
        second = http.client.HTTPConnection(host, int(port), timeout=30)
        assert _post(second, _many_names(5, "c")) == 200  # a fresh connection: all kept
        first.close()
        second.close()
        assert col.stop() == 0
    spans = _spans(data)
    names = set(spans[c.SERVICE_NAME]) | set(spans[c.HOST_NAME])
    for prefix, kept in (("a", 10), ("b", 5), ("c", 10)):
        assert sum(1 for n in names if n.startswith(f"{prefix}-")) == kept, prefix
