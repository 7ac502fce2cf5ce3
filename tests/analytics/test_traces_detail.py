"""One trace in full (issue 35 item 3): spans decoded by the collector with their attributes,
resource attributes, events and links, times to the millisecond; the request's energy; its
instance's signals during its lifetime, its own GPU only; and ``fleetlens traces show``."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from fleetlens.analytics.traces.detail import TABLES, TraceDetail, trace_detail
from fleetlens.analytics.traces.query import SearchError
from fleetlens.cli import cli
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, connect
from tests.analytics import traces_detail_data as k

NS = 1_000_000_000


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> DataDir:
    root = DataDir(tmp_path_factory.mktemp("trace-detail") / "data")
    k.build(root)
    return root


def _detail(root: DataDir, ident: str, *, drop: str | None = None) -> TraceDetail:
    con = connect(root, tables=TABLES)
    try:
        if drop:
            con.execute(f'DROP VIEW "{drop}"')
        return trace_detail(con, ident)
    finally:
        con.close()


def test_every_span_with_attributes_events_links_to_the_millisecond(root) -> None:
    d = _detail(root, k.TRACE)
    assert d.trace_id == k.TRACE and d.start_ns == k.T0
    spans = {r[c.SPAN_ID]: r for r in d.spans.iter_rows(named=True)}
    assert spans[k.GATEWAY]["offset_ms"] == 0.0 and spans[k.ENGINE]["offset_ms"] == 4.5
    assert spans[k.ENGINE]["duration_ms"] == 2250.0
    assert spans[k.GATEWAY]["duration_ms"] == 2255.75
    assert spans[k.GATEWAY][c.STATUS_MESSAGE] == "upstream"
    attrs = {(r["span"].split(" (")[0], r["source"], r["key"]): r["value"]
             for r in d.attributes.iter_rows(named=True)}
    assert attrs[("POST /v1/chat", "span", "retry")] == "true"
    assert attrs[("POST /v1/chat", "span", "tags")] == '["a", 3]'
    assert attrs[("POST /v1/chat", "resource", "region")] == "eu-west"
    assert attrs[("POST /v1/chat", "resource", "host.name")] == "edge-01"
    # promoted to typed columns by the collector, shown as the attributes they were
    assert attrs[("llm_request", "span", "gen_ai.request.id")] == k.REQUEST
    assert attrs[("llm_request", "span", "gen_ai.usage.prompt_tokens")] == "512"
    assert attrs[("llm_request", "span", "user.tier")] == "gold"
    assert attrs[("llm_request", "resource", "host.name")] == k.HOST
    (event,) = d.events.iter_rows(named=True)
    assert (event[c.NAME], event["offset_ms"], json.loads(event[c.ATTRIBUTES])) == \
        ("retry", 1234.0, {"attempt": 2})
    (link,) = d.links.iter_rows(named=True)
    assert (link["linked_trace_id"], link["linked_span_id"]) == (k.LINKED, "b2" * 8)
    assert json.loads(link[c.ATTRIBUTES]) == {"why": "fan-out"}


def test_the_request_energy_and_its_instance_signals_during_its_lifetime(root) -> None:
    d = _detail(root, k.REQUEST)  # a request id finds its trace
    (req,) = d.requests.iter_rows(named=True)
    assert (req[c.REQUEST_ID], req[c.ENERGY_J], req[c.ATTRIBUTION_COVERAGE]) == \
        (k.REQUEST, k.ENERGY_J, 0.98)
    assert req["offset_ms"] == 4.5 and req[c.QUEUE_S] == 0.25
    # its own instance and GPU only, not the neighbour's instance nor the host's other GPU
    assert set(d.signals["series"]) == {k.INSTANCE, k.MINE}
    assert set(d.signals["signal"]) == {c.KV_CACHE_USAGE, c.NUM_RUNNING, c.NUM_WAITING,
                                        c.SM_CLOCK_MHZ, c.POWER_W}
    # the samples inside its 2.25 s and the nearest on either side: T0 .. T0 + 3 s
    for (_, _), part in d.signals.group_by("signal", "series"):
        assert part["offset_ms"].to_list() == [0.0, 1000.0, 2000.0, 3000.0]
    power = d.signals.filter(signal=c.POWER_W)["value"].to_list()
    assert power == [400.0, 410.0, 420.0, 430.0]  # sample i = 10 .. 13 of GPU 0
    kv = d.signals.filter(signal=c.KV_CACHE_USAGE)["value"].to_list()
    assert kv == pytest.approx([0.6, 0.61, 0.62, 0.63])


def test_without_a_gpu_mapping_every_gpu_of_the_host(root) -> None:
    d = _detail(root, k.TRACE, drop=t.INSTANCE_GPUS)
    assert set(d.signals.filter(signal=c.POWER_W)["series"]) == {k.MINE, k.OTHER}


def test_unknown_ids_are_a_search_error(root) -> None:
    with pytest.raises(SearchError):
        _detail(root, "f" * 32)
    with pytest.raises(SearchError):
        _detail(root, "' OR 1=1 --")


def test_traces_show_table_and_json(root) -> None:
    args = ["traces", "show", k.REQUEST, "--data-dir", str(root.root)]
    out = CliRunner().invoke(cli, args)
    assert out.exit_code == 0, out.output
    assert f"trace {k.TRACE}, started 2026-09-21 14:13:20.123 UTC" in out.output
    for text in ("2026-09-21 14:13:20.127", "2,250.000", "retry", "fan-out", "eu-west",
                 "Instance signals: 20", "GPU-aaaa", "321.5"):
        assert text in out.output, text
    assert "GPU-bbbb" not in out.output
    out = CliRunner().invoke(cli, [*args, "--format", "json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert doc[c.TRACE_ID] == k.TRACE and doc[c.START_NS] == k.T0
    assert [s[c.SPAN_ID] for s in doc["spans"]] == [k.GATEWAY, k.ENGINE]
    assert doc["requests"][0][c.ENERGY_J] == k.ENERGY_J
    assert len(doc["signals"]) == 20 and len(doc["events"]) == len(doc["links"]) == 1
    bad = CliRunner().invoke(cli, ["traces", "show", "nope", "--data-dir", str(root.root)])
    assert bad.exit_code == 1 and "nope" in bad.output and "Traceback" not in bad.output
