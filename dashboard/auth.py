"""Login for the dashboard: none on loopback, a shared password, or OIDC (Streamlit auth).

Passwords are never stored: the config holds an scrypt hash (``fleetlens dashboard
--hash-password``), or the operator passes the password in ``FLEETLENS_DASHBOARD_PASSWORD``.
OIDC uses Streamlit's native ``st.login`` with the provider configured in the ``[auth]``
section of ``.streamlit/secrets.toml`` (redirect_uri, cookie_secret, client_id,
client_secret, server_metadata_url). Signing in only authenticates: the account must then be
on the ``oidc_allowed_*`` lists (:func:`oidc_refusal`), and nobody is when they are empty.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import secrets
from collections.abc import Callable
from typing import Any

import streamlit as st

from fleetlens.dashboard.config import ENV_PASSWORD, DashboardConfig
from fleetlens.dashboard.throttle import Throttle

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
        refusal = oidc_refusal(st.user.get, cfg)
        if refusal is not None:
            st.title("fleetlens")
            st.error(refusal)
            st.button("Log out", on_click=st.logout, key="logout")
            st.stop()
        st.sidebar.button("Log out", on_click=st.logout, key="logout")
        return
    if st.session_state.get("_authenticated"):
        return
    st.title("fleetlens")
    with st.form("login"):
        password = st.text_input("Password", type="password", key="password")
        submitted = st.form_submit_button("Log in")
    if submitted:
        _check(password, cfg)
    st.stop()


def oidc_refusal(claim: Callable[[str], Any], cfg: DashboardConfig) -> str | None:
    """Why the signed-in account may not see the dashboard, or None when it may.

    Args:
        claim: the account's claims by name (``st.user.get``).
        cfg: the allow-lists; all empty lets nobody in.
    """
    email = str(claim("email") or "").strip().lower()
    # Only a provider-verified address names a person: Entra ID, for one, lets a user set an
    # unverified email claim to any address.
    verified = claim("email_verified") in (True, "true")
    if verified and "@" in email:
        if email in {e.strip().lower() for e in cfg.oidc_allowed_emails}:
            return None
        domain = email.rpartition("@")[2]
        if domain in {d.strip().lower().lstrip("@") for d in cfg.oidc_allowed_domains}:
            return None
    groups = claim("groups") or ()
    groups = {groups} if isinstance(groups, str) else {str(g) for g in groups}
    if groups & set(cfg.oidc_allowed_groups):
        return None
    who = email or str(claim("sub") or "this account")
    hint = "" if verified or not email else " (the provider did not verify its e-mail address)"
    return (f"{who}{hint} is signed in but not allowed to see this dashboard; ask its operator "
            "to add the address, its domain or a group to oidc_allowed_* in [dashboard].")


@st.cache_resource(show_spinner=False)
def throttle() -> Throttle:
    """The server's failed-login record (shared by every session)."""
    return Throttle()


def _client() -> str:
    """The browser's address as the server saw it (one record for all when unknown)."""
    try:
        address = st.context.ip_address
    except Exception:  # noqa: BLE001 - no request context (bare runs)
        address = None
    return address if isinstance(address, str) and address else "unknown"


def _check(password: str, cfg: DashboardConfig) -> None:
    """Sign the session in, or say why not; a throttled client's try is not checked."""
    client, record = _client(), throttle()
    wait = record.wait_s(client)
    if wait > 0:
        st.error(f"Too many failed logins: try again in {math.ceil(wait)} s.")
        return
    if verify_password(password, cfg):
        record.succeeded(client)
        st.session_state["_authenticated"] = True
        st.rerun()
    wait = record.failed(client)
    st.error("Wrong password." + (f" Next try in {math.ceil(wait)} s." if wait else ""))


def _oidc_configured() -> bool:
    try:
        return "auth" in st.secrets
    except Exception:  # noqa: BLE001 - no secrets file at all
        return False
