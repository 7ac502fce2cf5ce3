"""Login for the dashboard: none on loopback, a shared password, or OIDC (Streamlit auth).

Passwords are never stored: the config holds an scrypt hash (``fleetlens dashboard
--hash-password``), or the operator passes the password in ``FLEETLENS_DASHBOARD_PASSWORD``.
OIDC uses Streamlit's native ``st.login`` with the provider configured in the ``[auth]``
section of ``.streamlit/secrets.toml`` (redirect_uri, cookie_secret, client_id,
client_secret, server_metadata_url).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets

import streamlit as st

from fleetlens.dashboard.config import ENV_PASSWORD, DashboardConfig

_N, _R, _P = 2**14, 8, 1


def hash_password(password: str, salt: bytes | None = None) -> str:
    """``scrypt$<salt hex>$<hash hex>`` of ``password``."""
    salt = salt or secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=_N, r=_R, p=_P, dklen=32)
    return f"scrypt${salt.hex()}${digest.hex()}"


def verify_password(password: str, cfg: DashboardConfig, environ=None) -> bool:  # noqa: ANN001
    """Whether ``password`` matches the configured hash or the password variable."""
    environ = os.environ if environ is None else environ
    if cfg.password_hash:
        _, salt, _ = cfg.password_hash.split("$")
        return hmac.compare_digest(hash_password(password, bytes.fromhex(salt)),
                                   cfg.password_hash)
    expected = environ.get(ENV_PASSWORD, "")
    # Without any configured secret nobody gets in: closed by default.
    return bool(expected) and hmac.compare_digest(password.encode(), expected.encode())


def require_login(cfg: DashboardConfig) -> None:
    """Stop the script run with a login form unless the session is signed in."""
    if cfg.auth == "none":
        return
    if cfg.auth == "oidc":
        if not bool(st.user.get("is_logged_in", False)):
            st.title("fleetlens")
            if not _oidc_configured():
                st.error('auth = "oidc" needs an [auth] section (redirect_uri, cookie_secret, '
                         "client_id, client_secret, server_metadata_url) in "
                         ".streamlit/secrets.toml; see docs/operations.md.")
            else:
                st.button("Log in", on_click=st.login, key="login")
            st.stop()
        st.sidebar.button("Log out", on_click=st.logout, key="logout")
        return
    if st.session_state.get("_authenticated"):
        return
    st.title("fleetlens")
    with st.form("login"):
        password = st.text_input("Password", type="password", key="password")
        submitted = st.form_submit_button("Log in")
    if submitted and verify_password(password, cfg):
        st.session_state["_authenticated"] = True
        st.rerun()
    if submitted:
        st.error("Wrong password.")
    st.stop()


def _oidc_configured() -> bool:
    try:
        return "auth" in st.secrets
    except Exception:  # noqa: BLE001 - no secrets file at all
        return False
