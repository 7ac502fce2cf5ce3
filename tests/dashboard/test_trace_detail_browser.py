"""The trace explorer's full trace in a real headless Chromium (issue 35 item 3): the figure
with the spans over the instance's signals, the tables of spans (times to the millisecond),
attributes, events and links with rows, the energy metric, and no error box. Over the small
known trace of :mod:`tests.analytics.traces_detail_data`, so no demo run is needed."""

from __future__ import annotations

import pytest

from fleetlens.pipeline.storage import DataDir
from tests.analytics import traces_detail_data as k
from tests.dashboard.test_browser import (  # noqa: F401 - browser is a fixture
    CHROMIUM,
    browser,
    check_page,
    dashboard,
    render,
    shot_dir,
)

pytestmark = [
    pytest.mark.e2e, pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian chromium (.ci/run installs it)"),
]

#: The cells of a table, as the grid's accessible cells read.
CELLS = """() => Array.from(document.querySelectorAll('[data-testid="stDataFrame"]'))
    .map(t => Array.from(t.querySelectorAll('[role="gridcell"]')).map(c => c.innerText))"""


def test_a_trace_in_full_in_a_real_browser(browser, tmp_path) -> None:  # noqa: ANN001, F811
    root = DataDir(tmp_path / "data")
    k.build(root)
    with dashboard(root.root, tmp_path / "dashboard.log") as url:
        page = browser.new_page(viewport={"width": 1500, "height": 3600})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        render(page, f"{url}/trace?id={k.TRACE}", [".js-plotly-plot",
                                                   '[data-testid="stMetric"]'])
        check_page(page, "trace detail")
        text = page.locator("body").inner_text()
        for shown in ("KV cache usage", "SM clock MHz", "power W", "ms since trace start",
                      "Attributes", "Events", "Links", "Energy"):
            assert shown in text, shown
        # one chart: the spans and the four signal rows share it (five x axes)
        assert page.locator(".js-plotly-plot").count() == 1
        assert page.locator(".js-plotly-plot .cartesianlayer > g.subplot").count() == 5
        tables = page.evaluate(CELLS)
        spans = " ".join(tables[0])
        page.screenshot(path=str(shot_dir(tmp_path) / "trace-detail.png"), full_page=True)
        assert "2026-09-21 14:13:20.123" in spans and "2255.75" in tables[0], tables[0]
        assert any("eu-west" in cell for cell in tables[2]), tables[2]
        page.screenshot(path=str(shot_dir(tmp_path) / "trace-detail.png"), full_page=True)
        assert not errors, errors
