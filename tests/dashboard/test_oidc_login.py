"""The whole OIDC login in Chromium: the dashboard (auth = "oidc", Streamlit's st.login)
against a real OpenID Connect provider on 127.0.0.1 started by the test."""

from __future__ import annotations

import secrets

import pytest

from tests.dashboard.oidc_provider import Provider
from tests.dashboard.test_browser import (  # noqa: F401 - browser is a fixture
    CHROMIUM,
    browser,
    dashboard,
    free_port,
)

pytestmark = [
    pytest.mark.e2e, pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian chromium (.ci/run installs it)"),
]


ALLOWED = {"FLEETLENS_DASHBOARD__AUTH": '"oidc"',
           "FLEETLENS_DASHBOARD__OIDC_ALLOWED_EMAILS": '["oncall@example.test"]'}


def _secrets(tmp_path, port: int, provider: Provider) -> None:  # noqa: ANN001
    streamlit_dir = tmp_path / ".streamlit"
    streamlit_dir.mkdir()
    (streamlit_dir / "secrets.toml").write_text(
        "[auth]\n"
        f'redirect_uri = "http://127.0.0.1:{port}/oauth2callback"\n'
        f'cookie_secret = "{secrets.token_hex(32)}"\n'
        f'client_id = "{provider.client_id}"\n'
        f'client_secret = "{provider.client_secret}"\n'
        f'server_metadata_url = "{provider.metadata_url}"\n')


def test_an_account_the_provider_signs_in_but_not_allowed_sees_nothing(
        demo_data, browser, tmp_path) -> None:  # noqa: F811
    """Issue 33: authentication is not authorization."""
    port = free_port()
    with Provider("fleetlens-dashboard", secrets.token_urlsafe(24)) as provider:
        _secrets(tmp_path, port, provider)
        with dashboard(demo_data[0].root, tmp_path / "dashboard.log", ALLOWED, cwd=tmp_path,
                       port=port) as url:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{url}/sql", wait_until="domcontentloaded")
            page.get_by_role("button", name="Log in").click()
            page.wait_for_url(f"{provider.issuer}/authorize*", timeout=60_000)
            page.locator("input[name='user']").fill("intruder")
            page.get_by_role("button", name="Sign in").click()
            page.get_by_text("not allowed to see this dashboard").wait_for(state="visible",
                                                                           timeout=60_000)
            assert "intruder@example.test" in page.locator('[data-testid="stAlert"]').inner_text()
            assert provider.tokens_issued == 1  # signed in, then refused
            for widget in ("stMetric", "stDataFrame", "stTextArea", "stSidebarNav"):
                assert page.locator(f'[data-testid="{widget}"]').count() == 0, widget
            assert page.get_by_role("button", name="Log out").is_visible()


def test_oidc_login_in_the_browser(demo_data, browser, tmp_path) -> None:  # noqa: F811
    port = free_port()
    with Provider("fleetlens-dashboard", secrets.token_urlsafe(24)) as provider:
        _secrets(tmp_path, port, provider)
        log = tmp_path / "dashboard.log"
        with dashboard(demo_data[0].root, log, ALLOWED, cwd=tmp_path, port=port) as url:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{url}/incidents", wait_until="domcontentloaded")
            login = page.get_by_role("button", name="Log in")
            login.wait_for(state="visible", timeout=60_000)
            assert page.locator('[data-testid="stMetric"]').count() == 0  # nothing before
            assert page.locator('[data-testid="stDataFrame"]').count() == 0
            login.click()
            # The provider's own sign-in page, reached through Streamlit's /auth/login.
            page.wait_for_url(f"{provider.issuer}/authorize*", timeout=60_000)
            page.get_by_role("button", name="Sign in").click()
            page.wait_for_selector('[data-testid="stMetric"]', state="visible", timeout=60_000)
            page.wait_for_selector('[data-testid="stStatusWidget"]', state="detached",
                                   timeout=60_000)
            assert page.locator("h1").first.inner_text() == "Fleet overview"
            assert page.get_by_role("button", name="Log out").is_visible()
            assert provider.tokens_issued == 1  # one code, exchanged once with PKCE
            assert page.locator('[data-testid="stException"]').count() == 0
            page.screenshot(path=str(tmp_path / "after-login.png"))
            # Logging out ends the session: the login button is back, the data is not.
            page.get_by_role("button", name="Log out").click()
            page.get_by_role("button", name="Log in").wait_for(state="visible",
                                                                timeout=60_000)
            assert page.locator('[data-testid="stMetric"]').count() == 0
