"""The [dashboard] config is closed by default; passwords are checked against scrypt hashes."""

from __future__ import annotations

import pytest

from fleetlens.dashboard.auth import hash_password, verify_password
from fleetlens.dashboard.config import DashboardConfig, is_loopback, load_dashboard_config
from fleetlens.pipeline.schema.settings import ConfigError


def test_defaults_bind_loopback_without_auth() -> None:
    cfg = load_dashboard_config(None, environ={})
    assert cfg.address == "127.0.0.1" and cfg.auth == "none"
    assert cfg.sql_row_cap == 1000


def test_fleetlens_config_has_the_dashboard_section(tmp_path) -> None:
    from fleetlens.config import load_config

    path = tmp_path / "fleetlens.toml"
    path.write_text('[dashboard]\nport = 9000\nsql_row_cap = 50\n')
    cfg = load_config(path, environ={})
    assert cfg.dashboard.port == 9000 and cfg.dashboard.sql_row_cap == 50


def test_public_address_requires_auth(tmp_path) -> None:
    path = tmp_path / "fleetlens.toml"
    path.write_text('[dashboard]\naddress = "0.0.0.0"\n')
    with pytest.raises(ConfigError, match="dashboard.auth"):
        load_dashboard_config(path, environ={})
    ok = load_dashboard_config(path, environ={
        "FLEETLENS_DASHBOARD__AUTH": "oidc",
        "FLEETLENS_DASHBOARD__OIDC_ALLOWED_DOMAINS": '["example.com"]'})
    assert ok.auth == "oidc" and ok.oidc_allowed_domains == ("example.com",)


def test_oidc_without_an_allow_list_does_not_start(tmp_path) -> None:
    """Issue 33: signing in with a public provider (Google, Microsoft "common") only says
    who someone is; with no allow-list every such account got the dashboard and its SQL."""
    path = tmp_path / "fleetlens.toml"
    path.write_text('[dashboard]\naddress = "0.0.0.0"\nauth = "oidc"\n')
    with pytest.raises(ConfigError, match="dashboard.oidc_allowed_emails"):
        load_dashboard_config(path, environ={})


@pytest.mark.parametrize("claims,allowed", [
    ({"email": "Oncall@Example.com", "email_verified": True}, True),  # case-insensitive
    ({"email": "oncall@example.com", "email_verified": "true"}, True),
    ({"email": "oncall@example.com"}, False),  # not verified: anyone can claim it
    ({"email": "oncall@example.com", "email_verified": False}, False),
    ({"email": "eve@example.com.evil.test", "email_verified": True}, False),
    ({"email": "eve@sub.example.com", "email_verified": True}, False),  # exact domain only
    ({"email": "ann@partner.test", "email_verified": True}, True),  # by domain
    ({"email": "bob@other.test", "email_verified": True, "groups": ["sre"]}, True),
    ({"email": "bob@other.test", "email_verified": True, "groups": "sre"}, True),
    ({"sub": "x", "groups": ["SRE", "dev"]}, False),  # groups match exactly
    ({}, False),
])
def test_oidc_accounts_are_authorized_by_the_allow_lists(claims: dict, allowed: bool) -> None:
    from fleetlens.dashboard.auth import oidc_refusal

    cfg = DashboardConfig(auth="oidc", oidc_allowed_emails=("oncall@example.com",),
                          oidc_allowed_domains=("@partner.test",), oidc_allowed_groups=("sre",))
    assert (oidc_refusal(claims.get, cfg) is None) is allowed
    empty = DashboardConfig()  # no list: nobody, whatever the claims
    assert oidc_refusal(claims.get, empty) is not None


@pytest.mark.parametrize("text,field", [
    ('auth = "basic"', "auth"), ("port = 0", "port"), ("sql_row_cap = 0", "sql_row_cap"),
    ('password_hash = "plain"', "password_hash"), ("prot = 1", "prot"),
])
def test_bad_values_name_the_field(tmp_path, text: str, field: str) -> None:
    path = tmp_path / "fleetlens.toml"
    path.write_text(f"[dashboard]\n{text}\n")
    with pytest.raises(ConfigError, match=f"dashboard.{field}"):
        load_dashboard_config(path, environ={})


def test_loopback_detection() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.1")
    assert not is_loopback("example.com")


def test_password_hash_round_trip() -> None:
    stored = hash_password("s3cret")
    cfg = DashboardConfig(auth="password", password_hash=stored)
    assert verify_password("s3cret", cfg, environ={})
    assert not verify_password("s3cret ", cfg, environ={})
    assert hash_password("s3cret") != stored  # salted


def test_password_from_environment_and_closed_without_one() -> None:
    cfg = DashboardConfig(auth="password")
    assert verify_password("pw", cfg, environ={"FLEETLENS_DASHBOARD_PASSWORD": "pw"})
    assert not verify_password("", cfg, environ={})
    assert not verify_password("anything", cfg, environ={})


PAGES = ("incidents", "incident_detail", "baselines", "kv_cache", "energy", "leaderboard",
         "capacity", "trace", "sql")


def _nothing_on_any_page(at) -> None:  # noqa: ANN001 - an AppTest
    """Every page, opened directly before logging in, shows no data and no SQL console."""
    for page in PAGES:
        at.switch_page(f"views/{page}.py")
        at.run()
        assert not at.exception, page
        shown = (len(at.metric), len(at.dataframe), len(at.get("plotly_chart")),
                 len(at.text_area))
        assert shown == (0, 0, 0, 0), (page, shown)
    at.switch_page("views/overview.py")
    at.run()


def test_password_login_gates_every_page(demo_data, monkeypatch) -> None:
    from streamlit.testing.v1 import AppTest

    from tests.dashboard.conftest import APP

    monkeypatch.setenv("FLEETLENS_DATA", str(demo_data[0].root))
    monkeypatch.delenv("FLEETLENS_CONFIG", raising=False)
    monkeypatch.setenv("FLEETLENS_DASHBOARD__AUTH", "password")
    monkeypatch.setenv("FLEETLENS_DASHBOARD_PASSWORD", "hunter2")
    from fleetlens.dashboard import data

    data.config.clear()
    try:
        at = AppTest.from_file(str(APP), default_timeout=60)
        at.run()
        assert not at.exception
        assert not at.metric and not at.get("plotly_chart")  # nothing rendered before login
        _nothing_on_any_page(at)
        at.text_input(key="password").input("wrong")
        at.button[0].click().run()
        assert at.error and not at.metric
        at.text_input(key="password").input("hunter2")
        at.button[0].click().run()
        assert not at.exception
        assert any(m.label == "Requests/s" for m in at.metric)
    finally:
        data.config.clear()


def test_cli_refuses_a_public_address_without_auth(tmp_path) -> None:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETLENS_")}
    out = subprocess.run([sys.executable, "-m", "fleetlens", "dashboard", "--data-dir",
                          str(tmp_path), "--address", "0.0.0.0", "--port", "8599"],
                         capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert out.returncode != 0
    assert "dashboard.auth" in out.stderr and "not loopback" in out.stderr


def test_hash_password_command(tmp_path) -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "fleetlens", "dashboard", "--hash-password"],
                         input="pw\npw\n", capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    stored = out.stdout.strip().splitlines()[-1]
    assert verify_password("pw", DashboardConfig(auth="password", password_hash=stored),
                           environ={})


def test_oidc_login_gates_every_page(demo_data, monkeypatch) -> None:
    from streamlit.testing.v1 import AppTest

    from fleetlens.dashboard import data
    from tests.dashboard.conftest import APP

    monkeypatch.setenv("FLEETLENS_DATA", str(demo_data[0].root))
    monkeypatch.delenv("FLEETLENS_CONFIG", raising=False)
    monkeypatch.setenv("FLEETLENS_DASHBOARD__AUTH", "oidc")
    monkeypatch.setenv("FLEETLENS_DASHBOARD__OIDC_ALLOWED_GROUPS", '["sre"]')
    data.config.clear()
    try:
        at = AppTest.from_file(str(APP), default_timeout=60)
        at.run()
        assert not at.exception
        assert at.error and "secrets.toml" in at.error[0].value  # not configured: says how
        assert not at.button and not at.metric and not at.get("plotly_chart")
        at = AppTest.from_file(str(APP), default_timeout=60)
        at.secrets["auth"] = {"redirect_uri": "http://127.0.0.1:8501/oauth2callback",
                              "cookie_secret": "x" * 32, "client_id": "id",
                              "client_secret": "secret",
                              "server_metadata_url": "https://idp.invalid/.well-known"}
        at.run()
        assert not at.exception
        assert [b.label for b in at.button] == ["Log in"]
        assert not at.metric and not at.get("plotly_chart") and not at.dataframe
        _nothing_on_any_page(at)
    finally:
        data.config.clear()


def test_auto_refresh_toggle(app) -> None:
    assert "_last_run" not in app.session_state
    app.sidebar.toggle(key="auto_refresh").set_value(True).run()
    assert not app.exception
    assert "_last_run" in app.session_state  # the timer fragment is armed (its tick is not
    assert any(m.label == "Requests/s" for m in app.metric)  # simulated by AppTest)
    app.sidebar.button(key="refresh").click().run()
    assert not app.exception
