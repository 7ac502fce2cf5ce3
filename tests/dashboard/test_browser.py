"""A real browser (Debian chromium, headless, via playwright) loads every page of a running
dashboard and finds charts, metrics and tables with rows, and no error box; every page is
screenshotted (``FLEETLENS_SCREENSHOT_DIR`` keeps them, to look at what a person sees)."""

from __future__ import annotations

import contextlib
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
    # A deep link to the default page (it used to open "Page not found" over it).
    "overview": ("Fleet overview", ['[data-testid="stMetric"]', ".js-plotly-plot",
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
    "traces?range=all&min=queue_s%3D0.4&sort=-queue_s": ("Traces", [
        ".js-plotly-plot", '[data-testid="stDataFrame"]']),
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


@contextlib.contextmanager
def dashboard(root: Path, log: Path, extra_env: dict[str, str] | None = None,  # noqa: ANN201
              *, cwd: Path | None = None, port: int | None = None):
    """``fleetlens dashboard`` over ``root`` on a free loopback port, stopped by PID (run in
    ``cwd``, where Streamlit reads ``.streamlit/secrets.toml``)."""
    port = port or free_port()
    env = {**os.environ, "FLEETLENS_DATA": str(root), **(extra_env or {})}
    env.pop("FLEETLENS_CONFIG", None)
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fleetlens", "dashboard", "--data-dir", str(root),
             "--port", str(port)], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd)
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
def server(real_demo, tmp_path_factory):
    """The dashboard over real demo data."""
    log = tmp_path_factory.mktemp("dash-log") / "dashboard.log"
    with dashboard(real_demo.root, log) as url:
        yield url


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
    """Open ``url`` and wait until every selector is visible, the script run finished and
    every table and chart has drawn its content."""
    page.goto(url, wait_until="domcontentloaded")
    page.wait_for_selector('[data-testid="stApp"]', timeout=timeout_ms)
    for selector in selectors:
        page.wait_for_selector(selector, state="visible", timeout=timeout_ms)
    # The status widget ("Running...") is shown while the script runs; wait until it is gone.
    page.wait_for_selector('[data-testid="stStatusWidget"]', state="detached",
                           timeout=timeout_ms)
    # A table draws its cells (role=gridcell) a moment after its element arrives; on a loaded
    # 2-core CI box that moment took over 20 s once (a trace page of seven tables), so the wait
    # is as long as the page's own.
    try:
        page.wait_for_function(EVERY_TABLE_HAS_ROWS, timeout=timeout_ms)
    except Exception:  # noqa: BLE001 - reported by check_page with the table's contents
        pass
    page.wait_for_timeout(300)  # let the last deltas paint


#: Every dataframe on the page shows at least one cell (not an empty box).
EVERY_TABLE_HAS_ROWS = """() => Array.from(document.querySelectorAll('[data-testid="stDataFrame"]'))
    .every(t => t.querySelectorAll('[role="gridcell"]').length > 0)"""


def check_page(page, path: str) -> None:  # noqa: ANN001
    """No exception box, error alert or "Page not found" dialog; no empty table or chart."""
    assert page.locator('[data-testid="stException"]').count() == 0, path
    assert page.locator('[data-testid="stAlertContentError"]').count() == 0, path
    assert page.get_by_text("Page not found").count() == 0, path
    assert page.locator('[role="dialog"]').count() == 0, (path, "a dialog is open")
    cells = page.evaluate("""() => Array.from(document.querySelectorAll(
        '[data-testid="stDataFrame"]')).map(t => t.querySelectorAll('[role="gridcell"]').length)""")
    assert all(cells), (path, "a table shows no rows", cells)
    drawn = page.evaluate("""() => Array.from(document.querySelectorAll('.js-plotly-plot'))
        .map(p => p.querySelectorAll('.main-svg').length)""")
    assert all(drawn), (path, "a chart was not drawn", drawn)


def shot_dir(tmp_path: Path) -> Path:
    kept = os.environ.get("FLEETLENS_SCREENSHOT_DIR")
    if kept:
        Path(kept).mkdir(parents=True, exist_ok=True)
        return Path(kept)
    return tmp_path


def test_every_page_renders_in_a_real_browser(server, browser, incident, tmp_path) -> None:
    # Tall enough that every element is in view: Streamlit scrolls inside its own container,
    # so a full-page screenshot of a short viewport cuts the page off.
    page = browser.new_page(viewport={"width": 1500, "height": 3200})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    shots = shot_dir(tmp_path)
    for path, (title, selectors) in PAGES.items():
        render(page, f"{server}/{path.format(incident=incident)}", selectors)
        heading = page.locator("h1").first.inner_text()
        assert title in heading, (path, heading)
        check_page(page, path)
        name = path.split("?")[0] or "root"
        page.screenshot(path=str(shots / f"{name}.png"), full_page=True)
    assert not errors, errors
    assert len(list(shots.glob("*.png"))) >= len(PAGES)


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


def test_an_error_shows_no_details_in_the_browser(browser, tmp_path) -> None:
    """client.showErrorDetails is off: an uncaught exception (here a corrupt Parquet file)
    shows a generic box; its message, type and traceback (paths, SQL) go to the log only."""
    from fleetlens.pipeline.schema import tables as t
    from fleetlens.pipeline.storage import DataDir

    root = DataDir(tmp_path / "broken")
    bad = root.derived(t.WINDOWS) / "date=2026-12-01" / "part-0.parquet"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"PAR1 this is not a parquet file PAR1")
    log = tmp_path / "dashboard.log"
    with dashboard(root.root, log) as url:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(url, wait_until="domcontentloaded")
        page.wait_for_selector('[data-testid="stException"]', state="visible", timeout=60_000)
        shown = page.locator('[data-testid="stException"]').inner_text()
    assert "part-0.parquet" not in shown and "Traceback" not in shown, shown
    assert "redacted" in shown and "Exception" not in shown and "Error:" not in shown, shown
    assert "part-0.parquet" in log.read_text()  # the details are in the server's log


@pytest.fixture(scope="module")
def failure_server(failure_data, tmp_path_factory):
    """The dashboard over synthetic data holding the failures analytics stores."""
    log = tmp_path_factory.mktemp("dash-failures-log") / "dashboard.log"
    with dashboard(failure_data[0].root, log) as url:
        yield url


def test_availability_and_a_failure_incident_in_a_real_browser(failure_server, browser,
                                                               tmp_path) -> None:
    from tests.dashboard import synth_failures as sf

    shots = shot_dir(tmp_path)
    page = browser.new_page(viewport={"width": 1500, "height": 2000})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    render(page, f"{failure_server}/availability",
           [".js-plotly-plot", '[data-testid="stMetric"]', '[data-testid="stDataFrame"]'])
    check_page(page, "availability")
    text = page.locator("body").inner_text()
    for shown in ("Availability", "Engines: up, down, no data", "Failure incidents: 3",
                  "SLOs and error budget", "Error budget exhausted: availability",
                  "No SLO configured for chat-api"):
        assert shown in text, shown
    # The down engine's row and the markers' labels are drawn in the charts' SVG.
    svg = "\n".join(page.locator(".js-plotly-plot").all_inner_texts())
    assert sf.DOWN_ENGINE in svg and "down" in svg and "restart" in svg, svg[:500]
    page.screenshot(path=str(shots / "availability.png"), full_page=True)

    render(page, f"{failure_server}/incident?id={sf.DOWN_ID}",
           [".js-plotly-plot", '[data-testid="stMetric"]', '[data-testid="stDataFrame"]'])
    check_page(page, "failure incident")
    text = page.locator("body").inner_text()
    for shown in ("Engine down", sf.DOWN_ENGINE, "5 min 0 s", "scrapes failed in a row",
                  "What it did to its peers", f"ttft_p99_s on {sf.PEER_HOST}"):
        assert shown in text, shown
    page.screenshot(path=str(shots / "incident-failure.png"), full_page=True)
    # The peer's latency incident opens from the link, and links back to the failure.
    page.get_by_text(f"ttft_p99_s on {sf.PEER_HOST}").click()
    page.wait_for_selector("text=Set off by a failure", timeout=60_000)
    assert not errors, errors


#: Page pixels of (time, latency) points on the first chart of a page (the Traces page's
#: heatmap), from plotly's own axes.
_TO_PIXELS = """([t0, t1, y0]) => {
    const gd = document.querySelector('.js-plotly-plot');
    const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
    const box = gd.getBoundingClientRect();
    const px = v => box.left + xa._offset + xa.l2p(xa.d2l(v));
    const py = v => box.top + ya._offset + ya.l2p(v);
    return [px(t0), px(t1), py(y0), py(ya.range[1]) + 2];
}"""


def test_a_box_drawn_on_the_traces_heatmap_lists_what_is_different(
        server, browser, real_demo, tmp_path) -> None:
    """Issue 35 item 2 in a real browser: a drag over the KV-pressure incident's slow band
    on the heatmap becomes the selection in the URL and lists its differences, h01 first."""
    import datetime as dt

    from fleetlens.analytics.traces.heatmap import heatmap
    from fleetlens.dashboard.trace_heatmap import _position
    from fleetlens.pipeline.schema import tables as t
    from fleetlens.pipeline.storage import scan
    from tests.dashboard.test_traces_heatmap import kv_selection

    metric, start, end, low = kv_selection(real_demo)
    # the band's lower edge on the page's y axis, which counts latency buckets
    grid = heatmap(scan(real_demo, t.REQUESTS).collect(), metric, min_width_s=60)
    low = _position(grid.latency_edges, low)
    page = browser.new_page(viewport={"width": 1500, "height": 2400})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    render(page, f"{server}/traces?range=all&hm={metric}", [".js-plotly-plot"])
    assert "Drag a box" in page.locator("body").inner_text()

    def at(ns: int) -> str:
        return dt.datetime.fromtimestamp(ns / 1e9, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S")

    x0, x1, y0, y_top = page.evaluate(_TO_PIXELS, [at(start), at(end), low])
    page.mouse.move(x0 + 1, y_top)
    page.mouse.down()
    page.mouse.move((x0 + x1) / 2, (y_top + y0) / 2, steps=5)
    page.mouse.move(x1 - 1, y0, steps=5)
    page.mouse.up()
    page.wait_for_url("**hm_from=**", timeout=60_000)
    page.wait_for_function("""() => document.querySelectorAll(
        '[data-testid="stDataFrame"]').length >= 2""", timeout=60_000)
    render(page, page.url, ['[data-testid="stDataFrame"]'])
    check_page(page, "traces heatmap selection")
    text = page.locator("body").inner_text()
    assert "requests selected" in text, text[:2000]
    cells = page.evaluate("""() => Array.from(document.querySelector(
        '[data-testid="stDataFrame"]').querySelectorAll('[role="gridcell"]'))
        .map(c => c.innerText)""")
    # the first row: its link, then its difference
    assert cells[1].strip() == "host_name=h01", cells[:12]
    assert "host=h01" in cells[0], cells[0]
    page.screenshot(path=str(shot_dir(tmp_path) / "traces-selection.png"), full_page=True)
    assert not errors, errors
