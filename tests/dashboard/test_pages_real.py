"""Every page renders on real demo data (simulator -> collector -> pipeline -> analytics)."""

from __future__ import annotations

import pytest

from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import scan
from tests.dashboard.conftest import APP

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture
def app_real(real_demo, monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("FLEETLENS_DATA", str(real_demo.root))
    monkeypatch.delenv("FLEETLENS_CONFIG", raising=False)
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_overview_on_real_data_lists_the_incidents(app_real, real_demo) -> None:
    incidents = scan(real_demo, t.INCIDENTS).collect()
    assert incidents.height >= 1
    assert len(app_real.get("plotly_chart")) == 6
    shown = app_real.dataframe[0].value
    assert len(shown) == incidents.height
    assert shown[c.CAUSE].notna().all()  # every incident comes with its top cause


@pytest.mark.parametrize("page", ["incidents", "incident_detail", "baselines", "kv_cache",
                                  "energy", "leaderboard", "trace", "sql"])
def test_page_renders_on_real_data(app_real, page: str) -> None:
    app_real.switch_page(f"views/{page}.py")
    app_real.run()
    assert not app_real.exception, [e.value for e in app_real.exception]
    assert not app_real.error, [e.value for e in app_real.error]
    assert app_real.title


def test_trace_waterfall_on_real_data(app_real, real_demo) -> None:
    slow = scan(real_demo, t.REQUESTS).sort(c.E2E_S, descending=True).head(1).collect()
    app_real.query_params["id"] = slow[c.TRACE_ID][0]
    app_real.switch_page("views/trace.py")
    app_real.run()
    assert not app_real.exception
    assert len(app_real.get("plotly_chart")) == 1
    assert app_real.metric[0].label == "E2E"


def test_filters_on_real_data(app_real, real_demo) -> None:
    hosts = app_real.sidebar.multiselect(key="f_hosts").options
    app_real.sidebar.multiselect(key="f_hosts").set_value([hosts[0]]).run()
    assert not app_real.exception
    ranking = app_real.dataframe[1].value
    assert list(ranking[c.HOST_NAME]) == [hosts[0]]


def test_incident_detail_exports_the_analytics_report(app_real, real_demo) -> None:
    first = scan(real_demo, t.INCIDENTS).sort(c.START_NS).head(1).collect()
    app_real.query_params["id"] = first[c.INCIDENT_ID][0]
    app_real.switch_page("views/incident_detail.py")
    app_real.run()
    assert not app_real.exception
    buttons = app_real.get("download_button")
    assert len(buttons) == 2  # Markdown and HTML, built on click
    assert app_real.dataframe[0].value[c.CAUSE].notna().all()
    from fleetlens.dashboard.data import report_text

    text, why = report_text(real_demo, first[c.INCIDENT_ID][0], "markdown")
    assert text is not None, why
    assert first[c.INCIDENT_ID][0] in text
    page, _ = report_text(real_demo, first[c.INCIDENT_ID][0], "html")
    assert page is not None and page.lstrip().lower().startswith("<!doctype html")
    assert report_text(real_demo, "0000000000000000", "markdown")[0] is None
