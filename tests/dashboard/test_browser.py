"""A real browser (Debian chromium, headless, via playwright) loads every page of a running
dashboard and finds charts, metrics and tables, and no error box."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from fleetlens.collector.testing import LOOPBACK_HEX, listening_addresses

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update"]
#: url path -> (title, selectors that must be present once rendered)
PAGES = {
    "": ("Fleet overview", ['[data-testid="stMetric"]', ".js-plotly-plot",
                                    '[data-testid="stDataFrame"]']),
    "incidents": ("Incidents", ['[data-testid="stDataFrame"]']),
    "incident?id={incident}": ("Incident detail", [
        '[data-testid="stMetric"]', ".js-plotly-plot", '[data-testid="stDataFrame"]',
        '[data-testid="stDownloadButton"]']),
    "baselines": ("Baselines", [".js-plotly-plot", '[data-testid="stMetric"]']),
    "kv-cache": ("KV cache", [".js-plotly-plot", '[data-testid="stMetric"]']),
    "energy": ("Energy", [".js-plotly-plot", '[data-testid="stMetric"]']),
    "leaderboard": ("Leaderboard", [".js-plotly-plot", '[data-testid="stDataFrame"]']),
    "trace": ("Trace explorer", ['[data-testid="stDataFrame"]']),
    "sql": ("SQL console", ['[data-testid="stTextArea"]']),
}

pytestmark = [
    pytest.mark.e2e, pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian chromium (.ci/run installs it)"),
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"dashboard exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"dashboard at {url} not healthy after {timeout_s} s")


@pytest.fixture(scope="module")
def incident(real_demo) -> str:
    """The first incident analytics found in the demo data."""
    from fleetlens.pipeline.schema import columns as c
    from fleetlens.pipeline.schema import tables as t
    from fleetlens.pipeline.storage import scan

    frame = scan(real_demo, t.INCIDENTS).sort(c.START_NS).collect()
    assert frame.height, "the demo found no incident"
    return frame[c.INCIDENT_ID][0]


@pytest.fixture(scope="module")
def server(real_demo, tmp_path_factory):
    """``fleetlens dashboard`` over real demo data on a free loopback port, stopped by PID."""
    port = free_port()
    log = tmp_path_factory.mktemp("dash-log") / "dashboard.log"
    env = {**os.environ, "FLEETLENS_DATA": str(real_demo.root)}
    env.pop("FLEETLENS_CONFIG", None)
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fleetlens", "dashboard", "--data-dir",
             str(real_demo.root), "--port", str(port)],
            stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                      args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


def render(page, url: str, selectors: list[str], timeout_ms: int = 60_000) -> None:  # noqa: ANN001
    """Open ``url`` and wait until every selector is visible and the script run finished."""
    page.goto(url, wait_until="domcontentloaded")
    page.wait_for_selector('[data-testid="stApp"]', timeout=timeout_ms)
    for selector in selectors:
        page.wait_for_selector(selector, state="visible", timeout=timeout_ms)
    # The status widget ("Running...") is shown while the script runs; wait until it is gone.
    page.wait_for_selector('[data-testid="stStatusWidget"]', state="detached",
                           timeout=timeout_ms)
    page.wait_for_timeout(300)  # let the last deltas paint


def test_every_page_renders_in_a_real_browser(server, browser, incident, tmp_path) -> None:
    page = browser.new_page(viewport={"width": 1500, "height": 1100})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    for path, (title, selectors) in PAGES.items():
        render(page, f"{server}/{path.format(incident=incident)}", selectors)
        heading = page.locator("h1").first.inner_text()
        assert title in heading, (path, heading)
        assert page.locator('[data-testid="stException"]').count() == 0, path
        assert page.get_by_text("Page not found").count() == 0, path
        name = path.split("?")[0] or "overview"
        page.screenshot(path=str(tmp_path / f"{name}.png"), full_page=True)
    assert not errors, errors
    assert len(list(tmp_path.glob("*.png"))) == len(PAGES)


def test_overview_shows_charts_metrics_and_the_incident(server, browser, tmp_path) -> None:
    page = browser.new_page(viewport={"width": 1500, "height": 1100})
    render(page, f"{server}/", ['[data-testid="stMetric"]', ".js-plotly-plot"])
    assert page.locator('[data-testid="stMetric"]').count() >= 10
    assert page.locator(".js-plotly-plot").count() == 6
    assert page.locator('[data-testid="stDataFrame"]').count() == 2
    assert "Active incidents" in page.locator("body").inner_text()
    page.screenshot(path=str(tmp_path / "overview.png"), full_page=True)
    shot = os.environ.get("FLEETLENS_SCREENSHOT")
    if shot:  # used to refresh docs/img/overview.png for the README
        page.screenshot(path=shot, full_page=False)


def test_sql_console_in_the_browser(server, browser) -> None:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    render(page, f"{server}/sql", ['[data-testid="stTextArea"]'])
    page.get_by_role("button", name="Run").click()
    page.wait_for_selector('[data-testid="stDataFrame"]', state="visible", timeout=60_000)
    page.wait_for_selector('[data-testid="stStatusWidget"]', state="detached", timeout=60_000)
    assert page.locator('[data-testid="stException"]').count() == 0
    assert "row(s)" in page.locator("body").inner_text()


def test_dashboard_binds_loopback_only(server) -> None:
    found = listening_addresses(int(server.rsplit(":", 1)[1]))
    assert found and found <= LOOPBACK_HEX, found
