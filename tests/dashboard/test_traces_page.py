"""The Traces page (issue 35 item 1 in the dashboard): a link's filters open the search it
names, the page's widgets write their filters back to the URL, each row links into the trace
explorer, and a bad filter is one error line. The rows are what analytics' search returns."""

from __future__ import annotations

import polars as pl
import pytest

from fleetlens.dashboard import trace_search
from fleetlens.dashboard.filters import Filters
from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import scan
from tests.dashboard.conftest import APP


@pytest.fixture
def fresh(demo_data, monkeypatch):
    """An AppTest not yet run, so a test can set the link it opens."""
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("FLEETLENS_DATA", str(demo_data[0].root))
    monkeypatch.delenv("FLEETLENS_CONFIG", raising=False)
    return AppTest.from_file(str(APP), default_timeout=60)


def open_traces(at, **query: str | list[str]):  # noqa: ANN001, ANN201
    for key, value in query.items():
        at.query_params[key] = value
    at.switch_page("views/traces.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def table(at) -> pl.DataFrame:  # noqa: ANN001
    return pl.from_pandas(next(d for d in at.dataframe if "open" in d.value.columns).value)


def _values(value: str | list[str]) -> list[str]:
    return value if isinstance(value, list) else [value]  # AppTest unwraps single values


def test_a_link_opens_its_search(fresh, demo_data) -> None:
    at = open_traces(fresh, range="all", host="gpu-host-01", min=f"{c.QUEUE_S}=0.4",
                     sort=f"-{c.QUEUE_S}")
    assert not at.error, [e.value for e in at.error]
    requests = scan(demo_data[0], t.REQUESTS).collect()
    expected = requests.filter((pl.col(c.HOST_NAME) == "gpu-host-01")
                               & (pl.col(c.QUEUE_S) >= 0.4)).sort(c.QUEUE_S, descending=True)
    assert 50 < expected.height  # the incident's long queues: more than a page
    shown = table(at)
    assert shown[c.REQUEST_ID].to_list() == expected[c.REQUEST_ID].head(50).to_list()
    assert f"of {expected.height:,}" in " ".join(cap.value for cap in at.caption)
    assert shown["open"][0] == (f"trace?id={expected[c.TRACE_ID][0]}"
                                f"&t={expected[c.ARRIVAL_NS][0]}")
    assert at.text_input(key="ts_min").value == f"{c.QUEUE_S}=0.4"
    assert at.selectbox(key="ts_sort").value == c.QUEUE_S
    assert len(at.get("plotly_chart")) == 2  # the latency heatmap, the page's phase split


def test_the_next_page_and_a_span_attribute_from_the_widgets_reach_the_url(
        app, demo_data) -> None:
    at = open_traces(app, range="all")
    at.text_area(key="ts_attr").set_value(f"{a.GEN_AI_PROMPT_TOKENS}>=1900").run()
    at.number_input(key="ts_page").set_value(2).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert _values(at.query_params["attr"]) == [f"{a.GEN_AI_PROMPT_TOKENS}>=1900"]
    assert _values(at.query_params["page"]) == ["2"]
    requests = scan(demo_data[0], t.REQUESTS).collect()
    expected = (requests.filter(pl.col(c.INPUT_TOKENS) >= 1900)
                .sort(c.E2E_S, descending=True)[c.REQUEST_ID].to_list())
    assert table(at)[c.REQUEST_ID].to_list() == expected[50:100]


def test_a_bad_filter_is_one_error_line(app) -> None:
    at = open_traces(app, range="all")
    at.text_input(key="ts_min").set_value("nope=1").run()
    assert not at.exception
    assert [e.value for e in at.error] == [
        next(e.value for e in at.error if "not a numeric column" in e.value)]
    assert "\n" not in at.error[0].value


def test_the_page_filters_round_trip_through_the_url() -> None:
    link = {"min": [f"{c.E2E_S}=2", f"{c.INPUT_TOKENS}=10"], "attr": ["k=v, w", "n>3"],
            "errors": ["only"], "sort": [c.TTFT_S], "page": ["3"], "finish": ["stop"]}
    state: dict = {}
    trace_search.seed(state, link)
    assert trace_search.encode(state) == {k: v if k in ("min", "attr", "finish") else v[0]
                                          for k, v in link.items()}
    query = trace_search.query_of(Filters(services=("chat",)), state)
    assert query.error is True and query.services == ("chat",)
    assert (query.sort, query.descending, query.offset) == (c.TTFT_S, False, 100)
    assert [str(attr) for attr in query.attrs] == ["k=v, w", "n>3"]
    assert trace_search.encode({}) == {}  # defaults make no parameters


def test_the_trace_explorer_offers_the_trace_as_otlp_json(app, demo_data) -> None:
    import json

    requests = scan(demo_data[0], t.REQUESTS).collect().sort(c.E2E_S, descending=True)
    trace_id, arrival = requests[c.TRACE_ID][0], requests[c.ARRIVAL_NS][0]
    app.query_params["id"] = trace_id
    app.query_params["t"] = str(arrival)
    app.switch_page("views/trace.py")
    app.run()
    assert not app.exception, [e.value for e in app.exception]
    from fleetlens.dashboard import data

    con = data._connection(str(demo_data[0].root), data.present_tables(demo_data[0]))
    from fleetlens.analytics.traces.otlp_export import otlp_json

    exported = json.loads(otlp_json(con, trace_id, arrival))
    spans = [s for rs in exported["resourceSpans"] for ss in rs["scopeSpans"]
             for s in ss["spans"]]
    assert {s["traceId"] for s in spans} == {trace_id} and len(spans) == 2  # gateway, engine
    buttons = app.get("download_button")
    assert [b.proto.label for b in buttons] == ["Download OTLP/JSON"]


@pytest.mark.e2e
@pytest.mark.slow
def test_on_the_real_demo_the_cli_and_the_page_find_the_same_requests(
        real_demo, monkeypatch) -> None:
    """Real vLLM-shaped spans (simulator -> collector -> pipeline): a promoted attribute and
    the sidebar's host in the CLI and on the page give the same requests, and the first
    one's trace exports as OTLP/JSON holding its engine span."""
    import json

    from click.testing import CliRunner
    from streamlit.testing.v1 import AppTest

    from fleetlens.cli import cli

    requests = scan(real_demo, t.REQUESTS).collect()
    host = requests[c.HOST_NAME].mode()[0]
    cli_rows = json.loads(CliRunner().invoke(cli, [
        "traces", "--data-dir", str(real_demo.root), "--host", host,
        "--attr", f"{a.GEN_AI_MAX_TOKENS}>=1", "--sort", f"-{c.E2E_S}",
        "--format", "json"]).stdout)
    assert cli_rows and all(r[c.HOST_NAME] == host for r in cli_rows)
    monkeypatch.setenv("FLEETLENS_DATA", str(real_demo.root))
    monkeypatch.delenv("FLEETLENS_CONFIG", raising=False)
    at = open_traces(AppTest.from_file(str(APP), default_timeout=120), range="all",
                     host=host, attr=f"{a.GEN_AI_MAX_TOKENS}>=1")
    assert not at.error, [e.value for e in at.error]
    assert table(at)[c.REQUEST_ID].to_list() == [r[c.REQUEST_ID] for r in cli_rows]
    out = CliRunner().invoke(cli, ["traces", "export", cli_rows[0][c.REQUEST_ID],
                                   "--data-dir", str(real_demo.root)])
    assert out.exit_code == 0, out.output
    spans = [s for rs in json.loads(out.stdout)["resourceSpans"] for ss in rs["scopeSpans"]
             for s in ss["spans"]]
    assert cli_rows[0][c.SPAN_ID] in {s["spanId"] for s in spans}
    assert {s["traceId"] for s in spans} == {cli_rows[0][c.TRACE_ID]}


def test_a_traces_view_is_shared_between_reruns_not_copied(demo_data, monkeypatch) -> None:
    """The view of a whole day is millions of rows: ``cache_data`` unpickled a copy on every
    rerun (0.65 s of the page's 1.0 s warm), and the heatmap and the comparison were computed
    again on each. The same objects come back until Refresh."""
    from fleetlens.analytics.traces.query import TraceQuery
    from fleetlens.dashboard import data

    monkeypatch.setenv("FLEETLENS_DATA", str(demo_data[0].root))
    monkeypatch.delenv("FLEETLENS_CONFIG", raising=False)
    first = data.load("trace_view", TraceQuery())
    assert first.height > 0
    assert data.load("trace_view", TraceQuery()) is first
    assert data.load("trace_view", TraceQuery(error=True)) is not first  # its own entry
    grid = data.load_derived("trace_heatmap", ("trace_view", TraceQuery()), c.E2E_S,
                             min_width_s=60)
    assert grid.total and data.load_derived(
        "trace_heatmap", ("trace_view", TraceQuery()), c.E2E_S, min_width_s=60) is grid
    assert data.load_derived("trace_heatmap", ("trace_view", TraceQuery()), c.TTFT_S,
                             min_width_s=60) is not grid
    data.clear()
    again = data.load("trace_view", TraceQuery())
    assert again is not first and again.equals(first)
    with pytest.raises(ValueError, match="not a shared result"):
        data.load_derived("trace_heatmap", ("trace_search", TraceQuery()), c.E2E_S)
